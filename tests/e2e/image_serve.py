"""What the end-to-end scripts of container-image functions share: the container engine as
`gantry serve` runs it, `gantry admin` on a data dir, a GET of the gateway's API, and the job
containers left on the machine."""

import json
import shlex
import subprocess
import urllib.request


def engine(command, *arguments):
    """The container engine `command` (with its global flags) run with `arguments`."""
    return subprocess.run(shlex.split(command) + list(arguments), capture_output=True, text=True, check=False)


def admin(gantry, data_dir, *arguments):
    subprocess.run([gantry, "admin", "--data-dir", data_dir, *arguments], check=True, capture_output=True)


def api(host, path, token):
    request = urllib.request.Request(f"{host}/api/v1/{path}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)


def job_containers(command):
    """Names of the job containers (labelled with their job) the engine still has."""
    listed = engine(command, "ps", "--all", "--filter", "label=gantry.job-id", "--format", "{{.Names}}")
    return [name for name in listed.stdout.split() if name]
