"""Generate the Python gRPC stubs from the .proto files beside them.

The stubs are committed so that installing vipu needs no protobuf compiler. `scripts/gen-protos`
rewrites them; a unit test regenerates them into a scratch directory and fails if the committed
ones differ, so the stubs can never drift from the protos.

The protos live under `src/vipu/api/protos/` and are compiled with `src/` as the include root, so
the generated modules import each other as `vipu.api.protos.*`. The gRPC method names on the wire
come from each file's `package` line (`virmgrpc`, ...), not from its path.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent / "protos"
SOURCE_ROOT = PROTO_DIR.parents[2]  # .../src

# Lines naming the generator's own version; they change with the toolchain, not with the protos.
_TOOL_VERSION_LINE = re.compile(r"(Protobuf Python Version|GRPC_GENERATED_VERSION|_runtime_version\.Domain\.PUBLIC|^\s+\d+,$)")


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Compile every proto into `out_root` (laid out like `src/`); return the files written."""
    from grpc_tools import protoc  # a build-time dependency only

    include = Path(protoc.__file__).parent / "_proto"
    out_root.mkdir(parents=True, exist_ok=True)
    relative = [str(path.relative_to(SOURCE_ROOT)) for path in proto_files()]
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{SOURCE_ROOT}",
            f"-I{include}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            *relative,
        ]
    )
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}")
    return sorted((out_root / PROTO_DIR.relative_to(SOURCE_ROOT)).glob("*_pb2*.py*"))


def comparable(text: str) -> str:
    """The generated text without the lines that only name the toolchain's version."""
    return "\n".join(line for line in text.splitlines() if not _TOOL_VERSION_LINE.search(line))


def main() -> int:
    for path in PROTO_DIR.glob("*_pb2*.py*"):
        path.unlink()
    scratch = SOURCE_ROOT.parent / "build" / "protos"
    shutil.rmtree(scratch, ignore_errors=True)
    for generated in generate(scratch):
        shutil.copy(generated, PROTO_DIR / generated.name)
        print(f"wrote {PROTO_DIR / generated.name}")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
