#!/usr/bin/env python3
"""The values table of charts/gantry/README.md, generated from charts/gantry/values.yaml.

Every value carries a `# -- description` comment right above its key (continued on following
`#` lines). A commented key is one row (its default is the whole value, e.g. a `resources`
map); keys without a comment are sections whose children are the rows. The type comes from
values.schema.json.

    python3 tests/helm/values_table.py                  # print the table
    python3 tests/helm/values_table.py --update charts/gantry/README.md   # rewrite the block between
                                                        # <!-- values-table:start/end -->

Needs PyYAML (in the checks' venv).
"""

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gantry"
START = "<!-- values-table:start -->"
END = "<!-- values-table:end -->"
KEY = re.compile(r"^(\s*)([A-Za-z0-9_.-]+):(\s.*)?$")


def described_keys(text):
    """(dotted path, description or None) of every mapping key, in file order."""
    keys = []
    stack = []  # (indent, key)
    pending = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            pending = None
            continue
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped[1:].strip())
            continue
        if stripped.startswith("- "):
            raise SystemExit(f"values.yaml:{number}: block lists are not supported by the table generator; use flow style")
        match = KEY.match(line)
        if not match:
            raise SystemExit(f"values.yaml:{number}: cannot read this line: {line!r}")
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        path = ".".join(key for _, key in stack)
        keys.append((path, " ".join(pending) if pending else None))
        pending = None
    return keys


def lookup(tree, path):
    for part in path.split("."):
        tree = tree[part]
    return tree


def schema_at(schema, path):
    for part in path.split("."):
        schema = schema.get("properties", {}).get(part)
        if schema is None:
            return None
    return schema


def type_name(schema):
    if schema is None:
        return "?"
    if "anyOf" in schema:
        return " or ".join(type_name(option) for option in schema["anyOf"])
    kind = schema.get("type", "any")
    if kind == "integer":
        return "int"
    if kind == "boolean":
        return "bool"
    if kind == "array":
        return "list"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict) and "properties" not in schema:
        return "map"
    return kind


def rows(values_text=None, values=None, schema=None):
    """[(key, type, default, description)] of every described value, plus the problems found:
    values without a description (in the file or in the loaded values), and paths unknown to
    the schema."""
    values_text = values_text if values_text is not None else (CHART / "values.yaml").read_text()
    values = values if values is not None else yaml.safe_load(values_text)
    schema = schema if schema is not None else json.loads((CHART / "values.schema.json").read_text())
    keys = described_keys(values_text)
    described = {path for path, description in keys if description}
    problems = []
    table = []
    for path, description in keys:
        if any(path.startswith(parent + ".") for parent in described):
            continue  # inside a described value (e.g. resources.requests.cpu)
        value = lookup(values, path)
        if description is None:
            if not isinstance(value, dict) or not value:
                problems.append(f"{path} has no `# --` description")
            continue
        node = schema_at(schema, path)
        if node is None:
            problems.append(f"{path} is not in values.schema.json")
        default = json.dumps(value, separators=(", ", ": "))
        table.append((path, type_name(node), default, description))

    def leaves(tree, prefix=""):
        for key, value in tree.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value and path not in described:
                yield from leaves(value, path + ".")
            else:
                yield path

    covered = {row[0] for row in table}
    for leaf in leaves(values):
        if leaf not in covered and not any(leaf.startswith(row + ".") for row in covered):
            problems.append(f"{leaf} has no row in the values table")
    return table, problems


def markdown(table):
    escape = lambda text: text.replace("|", "\\|")  # noqa: E731
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for path, kind, default, description in table:
        lines.append(f"| `{path}` | {kind} | `{escape(default)}` | {escape(description)} |")
    return "\n".join(lines) + "\n"


def readme_block(readme_text):
    """The text between the markers, or None."""
    if START not in readme_text or END not in readme_text:
        return None
    return readme_text.split(START, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def main(argv):
    table, problems = rows()
    for problem in problems:
        print(f"values.yaml: {problem}", file=sys.stderr)
    text = markdown(table)
    if len(argv) == 3 and argv[1] == "--update":
        readme = Path(argv[2])
        current = readme.read_text()
        if readme_block(current) is None:
            raise SystemExit(f"{readme}: no {START} ... {END} block")
        before, rest = current.split(START, 1)
        after = rest.split(END, 1)[1]
        readme.write_text(f"{before}{START}\n{text}{END}{after}")
        print(f"{readme}: values table updated ({len(table)} rows)")
    elif len(argv) == 1:
        sys.stdout.write(text)
    else:
        raise SystemExit(__doc__)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
