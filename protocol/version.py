# Bumped on any incompatible change of a message; the first byte of every frame.
PROTOCOL_VERSION = 4  # 2: HeartbeatReply (scheduler -> worker), input limits; 3: step timing (busy_s);
#   4: WorkerHello.compiled, ModelInfo dtype / device / compiled
