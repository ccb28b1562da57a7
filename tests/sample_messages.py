"""Valid messages of every type on every link, with the decoder of each link: what the codec
tests round-trip and what the decoder fuzzer seeds its corpus with."""
from protocol import SamplingParams
from protocol import client_messages as cm
from protocol import worker_messages as wm
from protocol.pooling import PoolingInfo, PoolingParams
from protocol.codec import (client_to_scheduler_decoder, scheduler_to_client_decoder, scheduler_to_worker_decoder,
                            worker_to_scheduler_decoder)

PARAMS = SamplingParams(max_tokens=32, min_tokens=2, temperature=0.7, top_p=0.9, top_k=40,
                        min_p=0.05, seed=7, stop_token_ids=[5, 6], ignore_eos=True, logprobs=3)
POOLING = PoolingParams(task="classify", dimensions=8, normalize=False, activation=False, token_type_ids=[0, 1, 1])
POOLING_INFO = PoolingInfo(task="classify", size=2, normalize=False, labels=["no", "yes"], pooling_type="CLS",
                           bidirectional=True)
LOGPROBS = cm.TokenLogprobs(token_id=3, logprob=-0.25, top_token_ids=[3, 4], top_logprobs=[-0.25, -2.0])

CLIENT_TO_SCHEDULER = [
    cm.Generate(requests=[cm.GenerateRequest("a", [1, 2, 3], PARAMS, priority=2, stream=True),
                          cm.GenerateRequest("b", [0], SamplingParams()),
                          cm.GenerateRequest("p", [1, 2, 3], SamplingParams(max_tokens=1), pooling=POOLING),
                          cm.GenerateRequest("q", [4], SamplingParams(max_tokens=1), pooling=PoolingParams())]),
    cm.Generate(requests=[]),
    cm.Abort(request_ids=["a", "b"]),
    cm.ModelInfoQuery(),
    cm.HealthQuery(),
]
SCHEDULER_TO_CLIENT = [
    cm.RequestOutputs(outputs=[
        cm.RequestOutput("a", [7, 8], 3, "stop", [LOGPROBS, LOGPROBS]),
        cm.RequestOutput("b", [], 1, "error", None, "worker_error", "boom"),
        cm.RequestOutput("c", [9], 4),
        cm.RequestOutput("p", [], 3, "stop", pooled=b"\x00\x00\x80\x3f")]),
    cm.ErrorReply(code="bad_frame", message="nope"),
    cm.ModelInfo(model="tiny-llama", vocab_size=32000, max_model_len=2048, eos_token_ids=[2],
                 tokenizer_json="{}", num_replicas=2),
    cm.ModelInfo(model="tiny-bert", pooling=POOLING_INFO),
    cm.ModelInfo(model=None),
    cm.Health(num_waiting=1, num_running=2, num_swapped=3, num_workers=1, num_free_blocks=4,
              num_total_blocks=5, num_free_state_slots=6, num_total_state_slots=7, steps_per_s=1.5,
              num_steps=8, num_finished=9, worker_kv_blocks_in_use=10, worker_state_slots_in_use=11,
              num_cached_blocks=12, num_prefix_cache_queries=13, num_prefix_cache_hits=14,
              unhealthy_replicas=["host/123/abc"]),
]
WORKER_TO_SCHEDULER = [
    wm.WorkerHello(worker_id="w0", model="tiny-llama", device="cpu", dtype="bfloat16", vocab_size=32000,
                   max_model_len=2048, block_size=16, num_gpu_blocks=100, num_cpu_blocks=10,
                   num_state_slots=0, eos_token_ids=[2], tokenizer_json=None, tensor_parallel_size=2, rank=1),
    wm.StepResult(step_id=3, sampled_token_ids=[5, -1, 7], logprobs=[LOGPROBS, None, LOGPROBS]),
    wm.StepResult(step_id=4, sampled_token_ids=[], error="oom"),
    wm.StepResult(step_id=5, sampled_token_ids=[-1, 7], pooled={0: b"\x00\x00\x80\x3f"}),
    wm.WorkerHello(worker_id="w1", model="tiny-bert", device="cpu", dtype="float32", vocab_size=30522,
                   max_model_len=512, block_size=16, num_gpu_blocks=100, num_cpu_blocks=0, num_state_slots=0,
                   eos_token_ids=[], tokenizer_json=None, pooling=POOLING_INFO),
    wm.Heartbeat(worker_id="w0", num_kv_blocks_in_use=3, num_state_slots_in_use=1, num_requests=2),
]
SCHEDULER_TO_WORKER = [
    wm.StepPlan(step_id=9, finished_ids=["x"], preempted_ids=["y"],
                new_requests=[wm.NewRequestData("a", [1, 2, 3, 4], 3, PARAMS, [0, 1], 0, 4),
                              wm.NewRequestData("p", [1, 2, 3], 3, SamplingParams(max_tokens=1), [2], 0, 3,
                                                pooling=POOLING)],
                running_requests=[wm.RunningRequestData("b", [2], 1), wm.RunningRequestData("c", [], 1)],
                blocks_to_swap_out=[(1, 2)], blocks_to_swap_in=[(3, 4)], blocks_to_copy=[(5, 6)]),
    wm.StepPlan(step_id=10, finished_ids=["x"], preempted_ids=[], new_requests=[], running_requests=[]),
    wm.Shutdown(reason="bye"),
    wm.HeartbeatReply(instance_id="abc123", known=False),
]
LINKS = [
    (CLIENT_TO_SCHEDULER, client_to_scheduler_decoder),
    (SCHEDULER_TO_CLIENT, scheduler_to_client_decoder),
    (WORKER_TO_SCHEDULER, worker_to_scheduler_decoder),
    (SCHEDULER_TO_WORKER, scheduler_to_worker_decoder),
]
ALL_MESSAGES = [m for messages, _ in LINKS for m in messages]
ALL_DECODERS = [make() for _, make in LINKS]
