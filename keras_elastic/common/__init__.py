"""Pieces shared by every service: tensor codec, gRPC helpers, timers."""
