"""Generates Python protobuf + gRPC stubs from proto/iox/*.proto into <repo>/iox/.

Called by setup.py's build step (and usable by hand: `python proto/build_stubs.py`).
The output package `iox` is build output: git ignores it, nobody edits it.
"""
import glob
import os

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PROTO_DIR = os.path.join(_ROOT, "proto")


def generate() -> None:
    from grpc_tools import protoc
    import grpc_tools

    out_pkg = os.path.join(_ROOT, "iox")
    os.makedirs(out_pkg, exist_ok=True)
    protos = sorted(glob.glob(os.path.join(_PROTO_DIR, "iox", "*.proto")))
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["protoc", f"-I{_PROTO_DIR}", f"-I{include}", f"--python_out={_ROOT}",
            f"--pyi_out={_ROOT}", f"--grpc_python_out={_ROOT}"] + protos
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed for {protos}")
    with open(os.path.join(out_pkg, "__init__.py"), "w") as f:
        f.write('"""Generated from proto/ by proto/build_stubs.py; do not edit."""\n')


if __name__ == "__main__":
    generate()
