"""The `iox` command line: serve, broker, client commands, the demo.

`main.py` (the parser and every subcommand), `output.py` (tables, CSV and JSON
for people and scripts), `demo.py` (`iox demo`) and `build_jvm_archive.py`
(`python -m iox_spark.server.cli.build_jvm_archive`, run by the setup).

May import: everything (it is the top layer).
"""
