# Bumped on any incompatible change of a message; the first byte of every frame.
PROTOCOL_VERSION = 7  # 2: HeartbeatReply (scheduler -> worker), input limits; 3: step timing (busy_s);
#   4: WorkerHello.compiled, ModelInfo dtype / device / compiled;
#   5: ModelInfo.num_replicas (was num_workers: it counts replicas; Health.num_workers counts processes);
#   6: WorkerHello and ModelInfo sampling_defaults (generation_config.json); 7: SamplingDefaults.max_tokens
