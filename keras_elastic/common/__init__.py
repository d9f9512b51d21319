"""Pieces shared by every service: tensor codec, gRPC helpers, the job token
(auth), TLS, timers.

May import: proto.
"""
