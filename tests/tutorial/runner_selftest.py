#!/usr/bin/env python3
"""The tutorial runner on made-up chapters: a correct one passes, and each kind of drift fails
it (a shown output line the commands do not print, a stated figure off by more than its last
digit, a false check, a command that fails, an expected failure that succeeds, a missing
figure); --update rewrites figures and output numbers. Usage: runner_selftest.py RUNNER WORKDIR"""
import os
import shutil
import subprocess
import sys

runner, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
repo = os.path.join(work, "repo")
os.makedirs(os.path.join(repo, "figures"))
build = os.path.join(work, "build")
os.makedirs(build)

GOOD = """# A chapter

```sh
echo "loss 5.4321 after 40 steps"
printf 'a\\nb 12\\nc\\n'
```

```output
loss 5.43 after 40 steps
...
b 7
```

The loss is <!--= grab(r"loss ([0-9.]+)", outputs[0]) ± 0.01 -->5.43 and falls below
<!--check grab(r"loss ([0-9.]+)", outputs[0]) < X-->6.

```sh expect-fail
echo "error: tp must divide heads: heads % tp = 96 % 5 = 1" >&2; exit 1
```

```output
error: tp must divide heads: heads % tp = ... = 1
```

```sh
mkdir -p runs/a && echo '{"step": 1, "loss": 2.5}' > runs/a/metrics.jsonl
echo '<svg xmlns="http://www.w3.org/2000/svg"></svg>' > runs/a/fig.svg
```

<!--check final_loss("runs/a") == 2.5-->
<!--figure runs/a/fig.svg-->
![fig](figures/fig.svg)
"""


def run(text, update=False, name="chapter"):
    path = os.path.join(repo, name + ".md")
    with open(path, "w") as f:
        f.write(text)
    cmd = [sys.executable, runner, path, "--repo", repo, "--build", build,
           "--scratch", os.path.join(work, "scratch")] + (["--update"] if update else [])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return p.returncode, p.stdout.decode(), path


failures = []


def expect(ok, what, out=""):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
        print(out)


open(os.path.join(repo, "figures", "fig.svg"), "w").write("<svg/>")
rc, out, _ = run(GOOD)
expect(rc == 0, "a correct chapter passes", out)

drifts = {
    "a shown line the commands do not print": GOOD.replace("b 7\n```", "b seven\n```"),
    "shown lines out of order": GOOD.replace("loss 5.43 after 40 steps\n...\nb 7", "b 7\nloss 5.43 after 40 steps"),
    "a figure off by more than its tolerance": GOOD.replace("-->5.43 and", "-->5.46 and"),
    "a false check": GOOD.replace("-->6.", "-->5."),
    "a command that fails": GOOD.replace('printf', 'false; printf'),
    "an expected failure that succeeds": GOOD.replace("; exit 1", ""),
    "a figure the commands did not write": GOOD.replace("<!--figure runs/a/fig.svg-->", "<!--figure runs/a/nope.svg-->"),
    "an unknown word after sh": GOOD.replace("```sh expect-fail", "```sh expect-failure"),
    "a table row of another label": GOOD.replace("printf 'a\\nb 12\\nc\\n'", "printf 'a\\nb 12\\nc\\n2 0.5\\n'")
                                          .replace("b 7\n```", "b 7\n32 0.4\n```"),
}
for what, text in drifts.items():
    rc, out, _ = run(text)
    expect(rc != 0, f"fails on {what}", out)

os.remove(os.path.join(repo, "figures", "fig.svg"))
rc, out, _ = run(GOOD)
expect(rc != 0 and "figures/fig.svg is missing" in out, "fails when the committed figure is missing", out)

stale = GOOD.replace("-->5.43 and", "-->5.21 and").replace("b 7\n```", "b 7\n```")
rc, out, path = run(stale, update=True)
text = open(path).read()
expect(rc == 0 and "-->5.43 and" in text, "--update rewrites a stated figure", out + text)
expect("b 12\n" in text and "loss 5.4321 after 40 steps" in text, "--update rewrites the output block", text)
expect(os.path.exists(os.path.join(repo, "figures", "fig.svg")), "--update copies the figure", out)
rc, out, _ = run(text)
expect(rc == 0, "the updated chapter passes", out)

sys.exit(1 if failures else 0)
