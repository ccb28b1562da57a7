# Bumped on any incompatible change of a message; the first byte of every frame.
PROTOCOL_VERSION = 2  # 2: HeartbeatReply (scheduler -> worker), input limits
