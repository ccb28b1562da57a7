# Bumped on any incompatible change of a message; the first byte of every frame.
PROTOCOL_VERSION = 3  # 2: HeartbeatReply (scheduler -> worker), input limits; 3: step timing (busy_s)
