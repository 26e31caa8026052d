"""Prints db/queue.rs's places statement (`read` with limit > 0) with literal values, so
bench/scale.sh EXPLAINs what the gateway runs: usage queue_statement.py QUEUE_RS AUTHOR_ID LIMIT."""
import re
import sys

source, author, limit = open(sys.argv[1]).read(), sys.argv[2], int(sys.argv[3])
macros = {
    name: re.sub(r"\\\n\s*", " ", "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', body, re.S)))
    for name, body in re.findall(r"macro_rules! (\w+) \{\s*\(\) => \{(.*?)\};\s*\}", source, re.S)
}
statement = re.search(r"true => concat!\((.*?)\),\s*\};", source, re.S).group(1)
parts = []
for token in re.finditer(r'"((?:[^"\\]|\\.)*)"|(\w+)!\(\)', statement, re.S):
    parts.append(macros[token.group(2)] if token.group(2) else re.sub(r"\\\n\s*", " ", token.group(1)))
sql = "".join(parts).replace("$1", f"'{author}'").replace("$2", str(limit)).replace("$3", "TRUE")
print(sql)
