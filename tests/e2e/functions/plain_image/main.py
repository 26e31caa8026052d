"""The function inside the old images tests/old_images.sh builds (their /runner): Debian 11 and
a root filesystem holding only a Python. Standard library only: no qiskit_serverless there.

Without the client a function still has the launcher's contract: its arguments are a JSON file
at ARGUMENTS_PATH, what it prints is its log (plain lines go to the provider's log, lines
starting with `[PUBLIC]` to the user's), and the JSON it writes to RESULTS_PATH is shipped
as the job's result. It prints and returns what shows which image it ran in: the image's
/etc/os-release, its C library's version, its Python, and whether a shell or libgcc_s is there.
"""

import json
import os
import platform
import sys

with open(os.environ["ARGUMENTS_PATH"], encoding="utf-8") as handle:
    arguments = json.load(handle)
name = arguments.get("name", "nobody")

os_release = {}
try:
    with open("/etc/os-release", encoding="utf-8") as handle:
        for line in handle:
            key, equals, value = line.strip().partition("=")
            if equals:
                os_release[key] = value.strip('"')
except FileNotFoundError:
    pass

libgcc = []
for folder in ("/lib", "/lib64", "/usr/lib", "/usr/lib64"):
    for root, _, files in os.walk(folder):
        libgcc.extend(os.path.join(root, file) for file in files if file.startswith("libgcc_s.so"))

libc, libc_version = platform.libc_ver()
print(f"plain function: hello {name}", flush=True)
print(f"[PUBLIC] plain function: hello {name}, without the client", flush=True)
print(f"os-release: {os_release.get('PRETTY_NAME', 'none (no /etc/os-release)')}", flush=True)
print(f"libc: {libc} {libc_version}; python {platform.python_version()} at {sys.executable}", flush=True)

result = {
    "name": name,
    "os_release": os_release,
    "libc": [libc, libc_version],
    "python": platform.python_version(),
    "executable": sys.executable,
    "shell": any(os.path.exists(path) for path in ("/bin/sh", "/usr/bin/sh")),
    "libgcc_s": sorted(set(libgcc)),
    "root": sorted(os.listdir("/")),
    "uid": os.getuid(),
    "cwd": os.getcwd(),
}
results = os.environ["RESULTS_PATH"]
os.makedirs(os.path.dirname(results), exist_ok=True)
with open(results, "w", encoding="utf-8") as handle:
    json.dump(result, handle)
