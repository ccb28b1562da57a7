# The first byte of every frame, so below 256. Bumped on any incompatible change of a message:
# peers of different versions do not talk (a frame of another version fails to decode, codec.py).
# What each version changed: docs/protocol.md.
PROTOCOL_VERSION = 10
