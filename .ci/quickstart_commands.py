"""Print the shell commands of README.md's Quickstart, one per line.

The Quickstart is the first ```bash fenced block after the '## Quickstart' heading; each non-empty,
non-comment line of it is one command.
"""

import sys

text = open(sys.argv[1], encoding="utf-8").read().splitlines()
in_section = in_block = False
for line in text:
    if line.startswith("## "):
        if in_section and not in_block:
            break
        in_section = line.strip().lower().startswith("## quickstart")
        continue
    if not in_section:
        continue
    if line.strip().startswith("```"):
        if in_block:
            break
        in_block = line.strip() in ("```bash", "```sh", "```shell")
        continue
    if in_block and line.strip() and not line.strip().startswith("#"):
        print(line.strip())
