#!/usr/bin/env python3
"""Generate docs/reference/configuration.md from the configuration dataclasses.

The page is built from the code, so it cannot drift from it: the sections and
keys are the fields of ``cynomys.core.config.Config`` (nested dataclasses are
sections) and of each target's own settings class (registered in
``cynomys.core.targets.TARGET_CONFIGS``, kept in the target's folder: keys of
``[target]``, or a section such as ``[target.spark]``), each key's type and default come from
``dataclasses.fields`` and the type hints, what a key accepts from the field's
validation metadata, and its explanation from the comment written above the
field (or after it, on the same line) in the dataclass's source.  A section's
introduction is its class docstring.

Keys the source does not comment yet get their text from ``EXTRA`` below, and
sections without a docstring from ``INTRO``; an entry there naming a key or a
section that no longer exists is an error, so renaming a field breaks the
check instead of leaving a stale line.  Once a field gets a comment in the
code, the comment wins and the script asks for the ``EXTRA`` entry to go.

    python scripts/gen_config_docs.py           # (re)write the page
    python scripts/gen_config_docs.py --check   # exit 1 if the committed page differs
    python scripts/gen_config_docs.py --stdout  # print it

It is also an mkdocs hook (``hooks:`` in mkdocs.yml): ``on_pre_build``
rewrites the page when it differs, so ``mkdocs build`` and ``mkdocs serve``
always show the current keys.  CI runs ``--check`` before the build, so a
page that was not regenerated and committed fails there.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import re
import sys
import textwrap
import tokenize
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "reference" / "configuration.md"
# Read the work tree's code, not an installed copy.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# --------------------------------------------------------------------------
# Text for keys and sections the code does not document yet ("section.key",
# dotted like the section names: "target.spark.master").  Keep each entry to
# what the code does; delete it once the field has a comment in the code.
# --------------------------------------------------------------------------
EXTRA: dict[str, str] = {
    "source.host": "The MySQL/MariaDB server to read. With TLS on, it must be a name in the server's certificate.",
    "source.port": "The server's TCP port.",
    "source.user": "The replication user. It needs `REPLICATION SLAVE`, `REPLICATION CLIENT` and `SELECT` "
                   "(and `ALL` on the watermark schema for DBLog snapshots, see `[snapshot] watermark_schema`).",
    "source.password": "The replication user's password. Prefer the environment (`CYNOMYS_SOURCE_PASSWORD`) "
                       "to the file.",
    "source.include_tables": "fnmatch patterns on `db.table` naming the tables to replicate, case-sensitive as "
                             "the server stores the names (all lower case with `lower_case_table_names = 1`); "
                             "the producer refuses to start on a pattern that matches a table only in another "
                             "case, warns about one that matches no table yet, and stops if a table created "
                             "later matches that one only in another case.",
    "source.exclude_tables": "fnmatch patterns on `db.table` to leave out; an exclusion wins over an inclusion. "
                             "Case-sensitive, checked at start as `include_tables`.",
    "source.use_gtid": "Resume by GTID instead of binlog file and position. Needed to follow a source failover: "
                       "pointed at another server, the producer resumes by GTID and refuses to start without one.",
    "source.connect_timeout_s": "Timeout of each connection to the source, in seconds.",
    "source.heartbeat_s": "The source's heartbeat period on the binlog stream, in seconds (idle detection, "
                          "shutdown latency).",
    "source.ssl_cert": "Client certificate for TLS to the source (with `ssl_key`), for users created "
                       "`REQUIRE X509`. See `[source] ssl_ca`.",
    "source.ssl_key": "The private key of `ssl_cert`. See `[source] ssl_ca`.",
    "producer.id": "Names the producer on the wire (every envelope's header); the applier's key map and its "
                   "state on the target use it.",
    "producer.state_dir": "Where the producer keeps its checkpoint (`producer.json`), snapshot and verify "
                          "requests and progress, and its health report.",
    "producer.batch_max_events": "Row changes per envelope; an envelope is cut at the next commit after this "
                                 "many. A transaction with more changes of its own is cut into fragments of "
                                 "this size (bounded memory).",
    "producer.batch_max_delay_ms": "The longest a change waits in the producer before its envelope is sent.",
    "transport.kind": "`redis` (a Redis Stream or pub/sub channel) or `file` (one local file, one host).",
    "transport.url": "`redis://` or `rediss://` (certificate and host name verified), AUTH in the URL; TLS "
                     "files as `?ssl_ca=...&ssl_cert=...&ssl_key=...`; unknown options are refused. Prefer "
                     "the environment (`CYNOMYS_TRANSPORT_URL`) for a URL with a password.",
    "transport.stream": "The Redis stream (or pub/sub channel) name. Every Redis key Cynomys uses starts "
                        "with it.",
    "transport.mode": "`stream`: a Redis Stream read through a consumer group, at-least-once delivery and "
                      "exactly-once effect. `pubsub`: the paper's transport, at-most-once (a subscriber that "
                      "is down loses what is published meanwhile; the applier stops on the hole).",
    "transport.path": "The transport file, for `kind = \"file\"`.",
    "transport.key_rotate_seconds": "Rotate the AES data key after this many seconds (or after "
                                    "`key_rotate_envelopes` envelopes, whichever comes first).",
    "transport.consumer_group": "The Redis consumer group the applier reads through. Partitioned appliers "
                                "use `<consumer_group>.p<i>`.",
    "security.applier_public_key": "Producer side: the applier's RSA public key, which wraps the data keys.",
    "security.producer_private_key": "Producer side: the producer's Ed25519 private key, which signs every "
                                     "envelope.",
    "security.applier_private_key": "Applier side: the applier's RSA private key, which unwraps the data keys.",
    "security.producer_public_key": "Applier side: the producer's Ed25519 public key, which checks every "
                                    "envelope's signature.",
    "security.passphrase": "Passphrase of encrypted private key files (`cynomys keygen --passphrase`); set it "
                           "as `CYNOMYS_SECURITY_PASSPHRASE`, not in the file.",
    "applier.buffer_rows": "Delay commit: flush when this many changes are buffered.",
    "applier.max_delay_ms": "Delay commit: flush when the oldest buffered change is this old.",
    "applier.state_dir": "Local applier files: its report (`applier.json`), health report and verify results. "
                         "The exactly-once state itself lives in the target.",
    "applier.consumer_name": "This applier's consumer name in the Redis consumer group (run one applier per "
                             "group).",
    "applier.partition": "Which partition this process is, `0 .. partitions-1` (see `partitions`).",
    "target.kind": "The target: a kind of the registry in `cynomys/core/targets.py`.",
    "target.url": "Where the target is: `mysql://user:pass@host:port/` (ColumnStore or MariaDB), "
                  "`monetdb://user:pass@host:50000/db` (`monetdbs://` for TLS), a DuckDB file path. Not "
                  "used by Spark. Prefer the environment (`CYNOMYS_TARGET_URL`).",
    "snapshot.chunk_bytes": "With `chunk_size` 0: a snapshot chunk's size in bytes, from the table's "
                            "`AVG_ROW_LENGTH` (between 1,000 and 200,000 rows).",
    "snapshot.watermark_schema": "Schema of the DBLog watermark table, created if missing; it must be "
                                 "in the binlog. Not used with `read_only`.",
    "snapshot.read_only": "Debezium's variant: GTID sets as watermarks, no writes to the source (works on "
                          "replicas and with a user holding only SELECT, REPLICATION SLAVE and REPLICATION "
                          "CLIENT).",
    "snapshot.throttle_ms": "Pause between chunks, in milliseconds.",
    "metrics.listen": "`host:port` where the daemon serves Prometheus `/metrics` and `/healthz`; empty: off. "
                      "A port already in use is a configuration error.",
    "metrics.stall_intervals": "No loop progress, or no successful source/target check, for this many "
                               "`health_interval_s` is unhealthy.",
    "log.level": "Log level of the daemons (the command line's `--log-level` wins).",
}

INTRO: dict[str, str] = {
    "producer": "The producer daemon (`cynomys produce`, on the source host): batching, its checkpoint, "
                "high availability.",
    "transport": "How envelopes travel from the producer to the applier: Redis (stream or pub/sub) or a file. "
                 "The wire format is described in `cynomys/transport/FORMAT.md`.",
    "applier": "The applier daemon (`cynomys apply`, on the analytics host): delay commit, partitions.",
    "target": "Where the applier writes. With no `[target]` section the applier writes Apache Iceberg tables "
              "through Spark in local mode into `./warehouse` next to the config file.",
    "log": "Logging of the daemons (to standard error).",
}


# --------------------------------------------------------------------------
# Reading the dataclasses
# --------------------------------------------------------------------------
@dataclass
class Key:
    section: str          # dotted section name, "target.spark"
    name: str
    type_text: str
    default: str
    env: str              # "" when the key cannot be set from the environment
    accepts: str          # the validation's words, or ""
    secret: bool
    path: bool
    text: str             # markdown
    from_code: bool       # text came from a comment in the code


@dataclass
class Section:
    name: str             # "source", "target.spark"
    cls: type
    intro: str
    keys: list[Key]
    # How the file writes it: "[source]", "[[shape.route]]" (a list of
    # tables), '[shape.tables."<pattern>"]' (a table of tables).
    title: str = ""
    # Keys of a list or table of tables are not read from the environment.
    no_env: bool = False

    @property
    def heading(self) -> str:
        return self.title or f"[{self.name}]"


def _source_notes(cls: type) -> tuple[str, dict[str, str]]:
    """(explicit class docstring, {field: comment text}) from the class source.

    A field's comment is the block of whole-line comments directly above it
    (no blank line between) plus a comment at the end of its own line(s)."""
    src = textwrap.dedent(inspect.getsource(cls))
    tree = ast.parse(src)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    doc = ast.get_docstring(node) or ""
    lines = src.splitlines()
    whole: dict[int, str] = {}     # line number -> comment, for comment-only lines
    trailing: dict[int, str] = {}  # line number -> comment after code
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            row = tok.start[0]
            if lines[row - 1].strip().startswith("#"):
                whole[row] = text
            else:
                trailing[row] = text
    notes: dict[str, str] = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        block: list[str] = []
        row = stmt.lineno - 1
        while row in whole:
            block.insert(0, whole[row])
            row -= 1
        end = stmt.end_lineno or stmt.lineno
        block += [trailing[r] for r in range(stmt.lineno, end + 1) if r in trailing]
        if block:
            notes[stmt.target.id] = " ".join(" ".join(block).split())
    return doc, notes


def _type_text(tp: Any, plural: bool = False) -> str:
    words = {bool: "boolean", int: "integer", float: "number", str: "string"}
    origin = typing.get_origin(tp)
    if origin is list:
        return f"list{'s' if plural else ''} of {_type_text(typing.get_args(tp)[0], True)}"
    if origin is dict:
        return f"table{'s' if plural else ''} of {_type_text(typing.get_args(tp)[1], True)}"
    return words.get(tp, getattr(tp, "__name__", str(tp))) + ("s" if plural else "")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _size_note(name: str, value: Any) -> str:
    if name.endswith("_bytes") and isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f" ({value >> 20} MiB)"
    return ""


_CODE = re.compile(r"(`[^`]*`)")


def _md(text: str) -> str:
    """Comment or docstring text as Markdown: RST ``code`` to `code`, and
    characters Markdown would take for markup escaped outside code spans."""
    text = text.replace("``", "`")
    out = []
    for i, part in enumerate(_CODE.split(text)):
        if i % 2 == 1:
            out.append(part)
            continue
        part = part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        part = part.replace("*", r"\*").replace("[", r"\[").replace("]", r"\]")
        out.append(part)
    return "".join(out)


def _paragraphs(doc: str) -> str:
    return "\n\n".join(_md(" ".join(p.split())) for p in doc.split("\n\n") if p.strip())


def collect() -> tuple[str, list[Section], list[str], list[str]]:
    """(module docstring, sections, errors, warnings)."""
    from cynomys.core import config as config_module

    errors: list[str] = []
    warnings: list[str] = []
    used_extra: set[str] = set()
    used_intro: set[str] = set()
    sections: list[Section] = []

    def walk(cls: type, name: str, title: str = "") -> None:
        doc, _ = _source_notes(cls)
        intro = _paragraphs(doc) if doc else ""
        if name in INTRO:
            used_intro.add(name)
            if doc:
                warnings.append(f"INTRO[{name!r}] is not used: the class has a docstring (delete the entry)")
            else:
                intro = _md(INTRO[name])
        section = Section(name, cls, intro, [], title, no_env=bool(title))
        sections.append(section)
        nested = add_keys(cls, section)
        for f in dataclasses.fields(cls):
            # The targets' own settings (cynomys/core/targets.py TARGET_CONFIGS,
            # each in its target's folder): keys of this section, or sub-sections.
            loader = f.metadata.get("options")
            for extra in (loader() if loader else ()):
                if extra.section:
                    nested.append((extra, f"{name}.{extra.section}", ""))
                else:
                    nested += add_keys(extra, section)
        for sub, sub_name, sub_title in nested:
            walk(sub, sub_name, sub_title)

    def add_keys(cls: type, section: Section) -> list[tuple[type, str, str]]:
        """Add ``cls``'s keys to ``section``; its nested sections, to walk."""
        name = section.name
        _, notes = _source_notes(cls)
        hints = typing.get_type_hints(cls)
        nested: list[tuple[type, str, str]] = []
        for f in dataclasses.fields(cls):
            if f.metadata.get("internal"):
                continue
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                nested.append((typing.cast(type, tp), f"{name}.{f.name}", ""))
                continue
            item = typing.get_args(tp)[-1] if typing.get_origin(tp) in (list, dict) else None
            if item is not None and dataclasses.is_dataclass(item):
                # A list of tables ([[shape.route]]) or a table of tables
                # ([shape.tables."<pattern>"]): a section of its own.
                sub = f"{name}.{f.name}"
                title = f"[[{sub}]]" if typing.get_origin(tp) is list else f'[{sub}."<pattern>"]'
                nested.append((typing.cast(type, item), sub, title))
                continue
            dotted = f"{name}.{f.name}"
            if f.name in notes:
                text, from_code = _md(notes[f.name]), True
                if dotted in EXTRA:
                    used_extra.add(dotted)
                    warnings.append(f"EXTRA[{dotted!r}] is not used: the field has a comment in the code "
                                    "(delete the entry)")
            elif dotted in EXTRA:
                used_extra.add(dotted)
                text, from_code = _md(EXTRA[dotted]), False
            else:
                text, from_code = "", False
                where = Path(inspect.getsourcefile(cls) or "?").resolve()
                shown = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
                warnings.append(f"[{name}] {f.name} has no description: add a comment above the field in {shown}")
            value = dataclasses.MISSING if f.metadata.get("required") else _default(f)
            default = "(required)" if value is dataclasses.MISSING else _toml(value)
            env = "" if typing.get_origin(tp) is dict or section.no_env else "CYNOMYS_" + dotted.replace(".", "_").upper()
            check = f.metadata.get("check")
            section.keys.append(Key(
                section=name, name=f.name, type_text=_type_text(tp),
                default=default + ("" if value is dataclasses.MISSING else _size_note(f.name, value)),
                env=env, accepts=check[1] if check else "", secret=bool(f.metadata.get("secret")),
                path=bool(f.metadata.get("path")), text=text, from_code=from_code))
        return nested

    root = config_module.Config
    hints = typing.get_type_hints(root)
    for f in dataclasses.fields(root):
        if f.metadata.get("internal"):
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            walk(typing.cast(type, tp), f.name)
        else:
            errors.append(f"Config.{f.name} is not a section; the generator handles only sections at the top")
    for stale in sorted(set(EXTRA) - used_extra):
        errors.append(f"EXTRA[{stale!r}] names a key the configuration does not have (renamed or removed?)")
    for stale in sorted(set(INTRO) - used_intro):
        errors.append(f"INTRO[{stale!r}] names a section the configuration does not have")
    return inspect.getdoc(config_module) or "", sections, errors, warnings


# --------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------
def _anchor(section: str, key: str = "") -> str:
    return "-".join([section.replace(".", "-")] + ([key] if key else []))


def render() -> tuple[str, list[str], list[str]]:
    module_doc, sections, errors, warnings = collect()
    out: list[str] = [
        "<!-- GENERATED by scripts/gen_config_docs.py from the dataclasses of cynomys/core/config.py and the",
        "     targets' config.py (cynomys/core/targets.py TARGET_CONFIGS):",
        "     do not edit; change the code (a comment above a field is its text here) and run the script. -->",
        "",
        "# Configuration reference",
        "",
        "Cynomys reads one TOML file, passed to every command as `-c FILE`; both daemons may share it. "
        "`cynomys config check -c FILE` validates it.",
        "",
    ]
    # The module docstring's paragraphs after its title line say how the file is read.
    paras = [p for p in module_doc.split("\n\n")[1:] if p.strip()]
    out += [_paragraphs("\n\n".join(paras)), ""] if paras else []
    out += [
        "Every key below shows its type, its default (in TOML), what it accepts where that is checked, and "
        "the environment variable that overrides it. Tables of strings (`conf`) cannot be set from the "
        "environment. Keys marked *secret* are redacted from logs and error messages: prefer the environment "
        "for them. Keys marked *path* are taken relative to the config file's folder.",
        "",
        "## Sections",
        "",
        "| section | keys |",
        "|---|---|",
    ]
    for s in sections:
        keys = ", ".join(f"[`{k.name}`](#{_anchor(s.name, k.name)})" for k in s.keys)
        out.append(f"| [`{s.heading}`](#{_anchor(s.name)}) | {keys} |")
    out.append("")
    for s in sections:
        out += [f"## `{s.heading}` {{#{_anchor(s.name)}}}", ""]
        if s.intro:
            out += [s.intro, ""]
        out += ["| key | type | default |", "|---|---|---|"]
        for k in s.keys:
            out.append(f"| [`{k.name}`](#{_anchor(s.name, k.name)}) | {k.type_text} | `{k.default}` |")
        out.append("")
        for k in s.keys:
            out += [f"### `{s.heading} {k.name}` {{#{_anchor(s.name, k.name)}}}", ""]
            facts = [f"**Type** {k.type_text}", f"**Default** `{k.default}`"]
            if k.accepts:
                facts.append(f"**Accepts** {_md(k.accepts)}")
            if not k.env:
                facts.append("**Environment** —")
            elif k.type_text.startswith("list"):
                facts.append(f"**Environment** `{k.env}` (comma-separated)")
            else:
                facts.append(f"**Environment** `{k.env}`")
            if k.secret:
                facts.append("*secret*")
            if k.path:
                facts.append("*path*")
            out += [" · ".join(facts), ""]
            if k.text:
                out += [k.text, ""]
    text = "\n".join(out).rstrip("\n") + "\n"
    return text, errors, warnings


def _report(errors: list[str], warnings: list[str]) -> None:
    for w in warnings:
        print(f"gen_config_docs: warning: {w}", file=sys.stderr)
    for e in errors:
        print(f"gen_config_docs: error: {e}", file=sys.stderr)


def write_if_changed() -> bool:
    """Write the page if it differs; True when it was written."""
    text, errors, warnings = render()
    _report(errors, warnings)
    if errors:
        try:
            from mkdocs.exceptions import PluginError
        except ImportError:
            raise SystemExit(1) from None
        raise PluginError("gen_config_docs: " + "; ".join(errors))
    if OUT.exists() and OUT.read_text(encoding="utf-8") == text:
        return False
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help=f"exit 1 if {OUT.relative_to(ROOT)} differs from what would be generated")
    mode.add_argument("--stdout", action="store_true", help="print the page instead of writing it")
    args = ap.parse_args(argv)
    text, errors, warnings = render()
    _report(errors, warnings)
    if errors:
        return 1
    rel = OUT.relative_to(ROOT)
    if args.stdout:
        sys.stdout.write(text)
        return 0
    current = OUT.read_text(encoding="utf-8") if OUT.exists() else None
    if args.check:
        if current != text:
            print(f"gen_config_docs: {rel} is out of date with the config dataclasses: "
                  "run `python scripts/gen_config_docs.py` and commit the result", file=sys.stderr)
            return 1
        print(f"gen_config_docs: {rel} is up to date")
        return 0
    if current == text:
        print(f"gen_config_docs: {rel} unchanged")
    else:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text, encoding="utf-8")
        print(f"gen_config_docs: wrote {rel}")
    return 0


# mkdocs hook (mkdocs.yml: hooks: [scripts/gen_config_docs.py])
def on_pre_build(config: Any, **_: Any) -> None:
    if write_if_changed():
        print(f"gen_config_docs: regenerated {OUT.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
