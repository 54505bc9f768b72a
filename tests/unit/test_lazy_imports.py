"""What the producer's start-up imports: not the SQL parser (sqlglot), which
only DDL to shape or a row filter needs (it was a fifth of `produce
--once`'s start-up).  In a fresh interpreter, as the daemon starts."""
from __future__ import annotations

import subprocess
import sys

from cynomys.parser import ddl, ddl_ops


def _imports(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
                         check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_the_producer_starts_without_the_sql_parser() -> None:
    loaded = _imports("import cynomys.cli.main, cynomys.cli.produce, cynomys.producer, cynomys.shape.stage")
    assert "cynomys.producer.loop" in loaded and "cynomys.parser.ddl_ops" in loaded
    assert "sqlglot" not in loaded and "cynomys.parser.ddl" not in loaded


def test_a_filter_or_a_ddl_still_brings_it_in() -> None:
    code = ("from cynomys.core.config import Config, ShapeConfig, TableRule\n"
            "from cynomys.shape.rules import compile_rules\n"
            "compile_rules(ShapeConfig(tables={'d.t': TableRule(filter='a = 1')}))")
    assert "sqlglot" in _imports(code)


def test_the_operations_are_the_parsers_own_names() -> None:
    assert ddl.NoOp is ddl_ops.NoOp and ddl.ALL_OPS is ddl_ops.ALL_OPS
    assert ddl.UnsupportedDdl is ddl_ops.UnsupportedDdl
    assert set(ddl.__all__) >= {op.__name__ for op in ddl_ops.ALL_OPS}
