"""Generates Python protobuf + gRPC stubs from proto/iox/*.proto into <repo>/iox_spark/iox/.

Called by setup.py's build step (and usable by hand: `python proto/build_stubs.py`).
The output package `iox_spark.iox` is build output: git ignores it, nobody edits it. protoc names
the stubs' imports of each other after the .proto paths (`from iox import ...`); they are
rewritten to the installed package (`from iox_spark.iox import ...`).
"""
import glob
import os
import re

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PROTO_DIR = os.path.join(_ROOT, "proto")


def generate() -> None:
    from grpc_tools import protoc
    import grpc_tools

    out_root = os.path.join(_ROOT, "iox_spark")
    out_pkg = os.path.join(out_root, "iox")
    os.makedirs(out_pkg, exist_ok=True)
    protos = sorted(glob.glob(os.path.join(_PROTO_DIR, "iox", "*.proto")))
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["protoc", f"-I{_PROTO_DIR}", f"-I{include}", f"--python_out={out_root}",
            f"--pyi_out={out_root}", f"--grpc_python_out={out_root}"] + protos
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed for {protos}")
    for path in glob.glob(os.path.join(out_pkg, "*_pb2*.py*")):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        fixed = re.sub(r"^from iox import ", "from iox_spark.iox import ", text, flags=re.M)
        if fixed != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(fixed)
    with open(os.path.join(out_pkg, "__init__.py"), "w") as f:
        f.write('"""Generated from proto/ by proto/build_stubs.py; do not edit."""\n')


if __name__ == "__main__":
    generate()
