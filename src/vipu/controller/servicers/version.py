"""The version service, on both end-points."""

from __future__ import annotations

from vipu import __version__
from vipu.api.protos import version_pb2, version_pb2_grpc


class VersionServicer(version_pb2_grpc.VersionServiceServicer):
    def GetVersion(self, request, context):
        return version_pb2.VersionReply(version=__version__)
