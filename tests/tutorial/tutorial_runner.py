#!/usr/bin/env python3
"""Runs one chapter of docs/tutorial/ the way a student would, and checks what the text says.

The marker convention (docs/tutorial/README.md, "How the tutorial is tested"):

  ```sh                 a command block: run, in order, by `bash -euo pipefail` in the chapter's
                        scratch directory (links to the repository's files, its own runs/).
                        Words after `sh`: `expect-fail` (the block must exit non-zero: an error
                        message the chapter shows), `timeout=SECONDS` (default 300), `id=NAME`
                        (markers further on read its output as output("NAME")).
  ```output             the abridged output of the command block before it. Every line must match
                        a line the commands printed, in order; numbers match any number (they
                        depend on the machine), `...` alone skips lines, `...` inside a line
                        matches any text.
  <!--= EXPR -->4.93    the number after the marker is EXPR, as written (to half a unit of its
  <!--= EXPR ± 0.05 -->  last digit, or to the tolerance given): a figure `--update` regenerates.
  <!--check EXPR-->     EXPR must be true; X is the number written right after the marker, if
                        any ("the loss falls below <!--check final_loss('runs/a') < X-->5.5").
  <!--figure PATH-->    the image that follows (![...](figures/NAME.svg)) is the file PATH the
                        commands wrote: it must exist and be SVG; `--update` copies it.

EXPR is Python with the helpers of `Helpers` below (out, grab, losses, ...); it sees the outputs
of the command blocks before the marker. `--update` rewrites the chapter in place: output
blocks (from the real output), `<!--=` figures and the figures/ files (docs/tutorial/regenerate.sh).
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?"
NUM_RE = re.compile(NUM)
MARKER_RE = re.compile(r"<!--(=|check|figure)\s(.*?)-->", re.S)
FOLLOWING_NUM_RE = re.compile(r"\s*(" + NUM + r")")


class ChapterError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Parsing: the chapter as a list of items in document order.
class Block:
    def __init__(self, kind, info, lines, line_no):
        self.kind, self.info, self.lines, self.line_no = kind, info, lines, line_no
        words = info.split()[1:]
        self.expect_fail = "expect-fail" in words
        self.timeout, self.id = 300, None
        for w in words:
            if w.startswith("timeout="):
                self.timeout = int(w.split("=", 1)[1])
            elif w.startswith("id="):
                self.id = w.split("=", 1)[1]
            elif w != "expect-fail":
                raise ChapterError(f"line {line_no}: unknown word '{w}' after ```sh "
                                   "(known: expect-fail, timeout=SECONDS, id=NAME)")
        self.output = None  # the Block of kind 'output' that follows, if any
        self.markers = []   # markers in the prose after this block, before the next command block


class Marker:
    def __init__(self, kind, expr, line_no, start, end, number, num_span):
        self.kind, self.expr, self.line_no = kind, expr.strip(), line_no
        self.start, self.end = start, end  # character span of the comment in the chapter text
        self.number, self.num_span = number, num_span


def parse_chapter(text):
    """Returns (preamble_markers, blocks); markers before the first command block go first."""
    lines = text.split("\n")
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    blocks, pre_markers, i = [], [], 0
    prose_spans = []  # (start_char, end_char) of prose regions, with the command block before them
    last_cmd = None
    prose_start = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(.*)$", lines[i])
        if not m:
            i += 1
            continue
        info = m.group(2).strip()
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise ChapterError(f"line {i + 1}: code block never closed")
        prose_spans.append((prose_start, offsets[i], last_cmd))
        kind = info.split()[0] if info else ""
        if kind in ("sh", "bash", "console", "shell"):
            if kind != "sh":
                raise ChapterError(f"line {i + 1}: command blocks are ```sh (got ```{kind})")
            b = Block("sh", info, lines[i + 1:j], i + 1)
            blocks.append(b)
            last_cmd = b
        elif kind == "output":
            if last_cmd is None or last_cmd.output is not None:
                raise ChapterError(f"line {i + 1}: an ```output block must follow its ```sh block")
            last_cmd.output = Block("output", "output", lines[i + 1:j], i + 1)
            last_cmd.output.first_char = offsets[i + 1] if i + 1 < len(offsets) else len(text)
            last_cmd.output.end_char = offsets[j]
        prose_start = offsets[j] + len(lines[j]) + 1
        i = j + 1
    prose_spans.append((prose_start, len(text), last_cmd))
    for start, end, owner in prose_spans:
        for m in MARKER_RE.finditer(text, start, end):
            line_no = text.count("\n", 0, m.start()) + 1
            num = FOLLOWING_NUM_RE.match(text, m.end())
            number = num.group(1) if num else None
            span = (num.start(1), num.end(1)) if num else None
            mk = Marker(m.group(1), m.group(2), line_no, m.start(), m.end(), number, span)
            (owner.markers if owner else pre_markers).append(mk)
    return pre_markers, blocks


# ---------------------------------------------------------------------------------------------
# Output blocks: shown lines against the real output.
def line_regex(shown):
    """A shown line as a regex: numbers match any number, `...` any text, spaces any spaces; but
    an integer that begins the line is a row's label ("  32  0.4155 ...", "128 nodes: ...") and
    must match itself, or the rows of a table would be interchangeable."""
    parts, pos = [], 0
    s = shown.strip()
    label = re.match(r"\d+(?=[\s:]|$)", s)
    if label:
        parts.append(re.escape(label.group(0)))
        pos = label.end()
    token_re = re.compile(r"(\.\.\.|…)|(" + NUM + r")|(\s+)")
    for m in token_re.finditer(s, pos):
        parts.append(re.escape(s[pos:m.start()]))
        if m.group(1):
            parts.append(".*?")
        elif m.group(2):
            parts.append("(" + NUM + ")")
        else:
            parts.append(r"\s+")
        pos = m.end()
    parts.append(re.escape(s[pos:]))
    return re.compile("".join(parts))


ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def terminal_text(text):
    """What a terminal leaves readable: escape sequences (a progress bar's erase-line) dropped,
    carriage returns as line ends, so each state of a progress bar is a line."""
    return ANSI_RE.sub("", text).replace("\r", "\n")


def is_skip(line):
    return line.strip() in ("", "...", "…")


def match_output(shown_lines, actual):
    """Returns [(shown_index, actual_line_index)] or raises ChapterError naming the first miss."""
    actual_lines = [a.rstrip() for a in terminal_text(actual).split("\n")]
    matches, k = [], 0
    for idx, shown in enumerate(shown_lines):
        if is_skip(shown):
            continue
        rx = line_regex(shown)
        start = k
        while k < len(actual_lines) and not rx.fullmatch(actual_lines[k].strip()):
            k += 1
        if k == len(actual_lines):
            raise ChapterError(f"shown output line not printed (in this order):\n    {shown.strip()}\n"
                               f"  searched from output line {start + 1}")
        matches.append((idx, k))
        k += 1
    return matches, actual_lines


def updated_output(shown_lines, actual):
    matches, actual_lines = match_output(shown_lines, actual)
    new = list(shown_lines)
    for idx, k in matches:
        shown = shown_lines[idx]
        if "..." in shown or "…" in shown:  # keep the abridgement, refresh only the numbers
            got = line_regex(shown).fullmatch(actual_lines[k].strip()).groups()
            it = iter(got)
            indent, body = shown[:len(shown) - len(shown.lstrip())], shown.strip()
            label = re.match(r"\d+(?=[\s:]|$)", body)
            head = label.group(0) if label else ""
            new[idx] = indent + head + NUM_RE.sub(lambda m: next(it), body[len(head):])
        else:
            new[idx] = actual_lines[k]
    return new


# ---------------------------------------------------------------------------------------------
# What a marker's expression can use.
class Helpers:
    def __init__(self, scratch):
        self.scratch = scratch
        self.out = ""
        self.outputs = []
        self.named = {}

    def output(self, name):
        """The output of the command block marked ```sh id=NAME."""
        if name not in self.named:
            raise ChapterError(f"output: no command block with id={name} before this marker")
        return self.named[name]

    def path(self, p):
        return os.path.join(self.scratch, p)

    def read(self, p):
        with open(self.path(p)) as f:
            return f.read()

    def exists(self, p):
        return os.path.exists(self.path(p))

    def grab(self, pattern, text=None, group=1):
        text = self.out if text is None else text
        m = re.search(pattern, text, re.M)
        if not m:
            raise ChapterError(f"grab: no match for /{pattern}/ in the output")
        return float(m.group(group).replace(",", ""))

    def after(self, marker, text=None):
        """The text after the first line that contains `marker` (e.g. one table of an output)."""
        text = self.out if text is None else text
        k = text.find(marker)
        if k < 0:
            raise ChapterError(f"after: '{marker}' is not in the output")
        return text[text.find("\n", k) + 1:]

    def grab_all(self, pattern, text=None, group=1):
        text = self.out if text is None else text
        return [float(m.group(group).replace(",", "")) for m in re.finditer(pattern, text, re.M)]

    def jsonout(self, text=None):
        text = self.out if text is None else text
        return json.loads(text[text.index(next(c for c in text if c in "[{")):])

    def metrics(self, run):
        with open(self.path(os.path.join(run, "metrics.jsonl"))) as f:
            return [json.loads(l) for l in f if l.strip()]

    def step_records(self, run):
        return [r for r in self.metrics(run) if "loss" in r]

    def losses(self, run):
        return {r["step"]: r["loss"] for r in self.metrics(run) if "loss" in r}

    def val_losses(self, run):
        return {r["step"]: r["val_loss"] for r in self.metrics(run) if "val_loss" in r}

    def final_loss(self, run):
        l = self.losses(run)
        return l[max(l)]

    def final_val_loss(self, run):
        l = self.val_losses(run)
        return l[max(l)]

    def steps(self, run):
        return sorted(self.losses(run))

    def median(self, xs):
        xs = sorted(xs)
        n = len(xs)
        return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])

    def max_rel_diff(self, a, b):
        common = sorted(set(a) & set(b))
        if not common:
            raise ChapterError("max_rel_diff: no common steps")
        return max(abs(a[k] - b[k]) / max(abs(a[k]), 1e-30) for k in common)

    def namespace(self, x):
        ns = {name: getattr(self, name) for name in dir(self) if not name.startswith("_")}
        ns.update({k: getattr(math, k) for k in dir(math) if not k.startswith("_")})
        ns.update({"out": self.out, "outputs": self.outputs, "X": x, "re": re, "abs": abs, "min": min,
                   "max": max, "len": len, "sum": sum, "all": all, "any": any, "sorted": sorted,
                   "round": round, "int": int, "float": float})
        return ns


def parse_number(s):
    return float(s.replace(",", ""))


def half_unit(s):
    """Half a unit of the last written digit: '4.93' -> 0.005, '1,234' -> 0.5, '2.5e-08' -> 5e-10."""
    mant, _, exp = s.replace(",", "").lower().partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    return 0.5 * 10 ** (-decimals) * (10 ** int(exp) if exp else 1)


def format_like(value, written):
    mant, e, exp = written.lower().partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    if e:
        return f"{value:.{decimals}e}".replace("e-0", "e-").replace("e+0", "e+")
    if "," in written:
        return f"{value:,.{decimals}f}"
    return f"{value:.{decimals}f}"


def split_tolerance(expr):
    m = re.match(r"^(.*?)(?:±|\+-)\s*(" + NUM + r")\s*(%?)\s*$", expr, re.S)
    if not m:
        return expr, None, False
    return m.group(1), float(m.group(2)), m.group(3) == "%"


def evaluate(marker, helpers, figures_dir, update, edits, chapter):
    where = f"{chapter}:{marker.line_no}"
    x = parse_number(marker.number) if marker.number else None
    if marker.kind == "figure":
        src = helpers.path(marker.expr)
        if not os.path.exists(src):
            raise ChapterError(f"{where}: figure {marker.expr} was not written by the commands")
        root = ET.parse(src).getroot()
        if not root.tag.endswith("svg"):
            raise ChapterError(f"{where}: figure {marker.expr} is not an SVG document")
        return f"figure {marker.expr}: SVG, {os.path.getsize(src)} bytes"
    if marker.kind == "check":
        try:
            ok = eval(marker.expr, helpers.namespace(x))
        except ChapterError:
            raise
        except Exception as e:
            raise ChapterError(f"{where}: check `{marker.expr}` raised {type(e).__name__}: {e}")
        if not ok:
            raise ChapterError(f"{where}: check failed: `{marker.expr}`" + (f" with X = {x}" if x is not None else ""))
        return f"check `{marker.expr}`" + (f" (X = {marker.number})" if x is not None else "") + ": true"
    # "=": the written number is the expression's value.
    if marker.number is None:
        raise ChapterError(f"{where}: <!--= ...--> must be followed by the number it states")
    expr, tol, pct = split_tolerance(marker.expr)
    try:
        value = float(eval(expr, helpers.namespace(x)))
    except ChapterError:
        raise
    except Exception as e:
        raise ChapterError(f"{where}: `{expr.strip()}` raised {type(e).__name__}: {e}")
    allowed = half_unit(marker.number) * (1 + 1e-9)
    if tol is not None:
        allowed = max(allowed, tol * abs(value) / 100 if pct else tol)
    if update:
        new = format_like(value, marker.number)
        if new != marker.number:
            edits.append((marker.num_span, new))
        return f"figure `{expr.strip()}` = {value:.6g}: written {marker.number}, now {new}"
    if not abs(value - x) <= allowed:
        raise ChapterError(f"{where}: the text says {marker.number} but `{expr.strip()}` = {value:.6g} "
                           f"(allowed difference {allowed:.3g}); rerun docs/tutorial/regenerate.sh if the "
                           "tool's figure moved for a good reason")
    return f"figure `{expr.strip()}` = {value:.6g}: written {marker.number} (within {allowed:.3g})"


# ---------------------------------------------------------------------------------------------
def make_scratch(scratch, repo, build):
    """A fresh directory that looks like the repository root to the commands: a copy of its
    files (so that a command which edits one, e.g. `sed -i` on a copy of catalog/, edits the
    copy), `build` -> the build directory, links to corpus/ and data-cache/ (the prepared corpus,
    shared by every chapter and never rewritten: `data prepare --reuse` finds it), its own runs/."""
    if os.path.exists(scratch):
        shutil.rmtree(scratch)
    os.makedirs(scratch)
    linked = ("corpus", "data-cache")
    for name in os.listdir(repo):
        src, dst = os.path.join(repo, name), os.path.join(scratch, name)
        if name in ("runs", ".git") or name.startswith("build"):
            continue
        if name in linked:
            os.symlink(src, dst)
        elif os.path.isdir(src):
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy2(src, dst)
    os.symlink(build, os.path.join(scratch, "build"))


def run_env():
    env = dict(os.environ)
    # Open MPI's environment equivalents of `mpirun --allow-run-as-root --oversubscribe` (CI runs
    # as root on 2 cores), plus the settings of tests/dist for oversubscribed ranks.
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_mpi_yield_when_idle": "1",
                "OMPI_MCA_btl_vader_single_copy_mechanism": "none"})
    # The shipped catalog's local machine, never a profile of the machine the chapter runs on
    # (core/profile_cache.hpp): the chapters' figures must not depend on it.
    env["EXATRAIN_PROFILE"] = "off"
    return env


def run_block(block, scratch, env):
    script = "\n".join(block.lines) + "\n"
    t0 = time.time()
    try:
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=scratch, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=block.timeout)
        out, rc = p.stdout.decode("utf-8", "replace"), p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace")
        raise ChapterError(f"line {block.line_no}: the commands ran past {block.timeout} s:\n{script}\n{out}")
    return out, rc, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapter")
    ap.add_argument("--repo", required=True, help="the repository root")
    ap.add_argument("--build", required=True, help="the build directory (holds exatrain)")
    ap.add_argument("--scratch", required=True, help="the chapter's scratch directory (recreated)")
    ap.add_argument("--show", action="store_true", help="print every command block's output (for authors)")
    ap.add_argument("--update", action="store_true",
                    help="rewrite output blocks, <!--= figures and figures/ from this run")
    args = ap.parse_args()
    chapter = os.path.relpath(args.chapter, args.repo)
    with open(args.chapter) as f:
        text = f.read()
    figures_dir = os.path.join(os.path.dirname(os.path.abspath(args.chapter)), "figures")
    t_start = time.time()
    try:
        pre, blocks = parse_chapter(text)
        if not blocks:
            raise ChapterError("no ```sh command blocks")
        make_scratch(args.scratch, os.path.abspath(args.repo), os.path.abspath(args.build))
        helpers, env, edits, figures = Helpers(args.scratch), run_env(), [], []
        for mk in pre:
            print("  " + evaluate(mk, helpers, figures_dir, args.update, edits, chapter))
        for n, b in enumerate(blocks, 1):
            out, rc, secs = run_block(b, args.scratch, env)
            out = terminal_text(out)
            helpers.out = out
            helpers.outputs.append(out)
            if b.id:
                helpers.named[b.id] = out
            first = b.lines[0] if b.lines else ""
            print(f"[{n}/{len(blocks)}] line {b.line_no}: {first[:90]}  ({secs:.1f} s, exit {rc})")
            if args.show:
                print("".join("    | " + l + "\n" for l in out.rstrip("\n").split("\n")))
            if (rc != 0) != b.expect_fail:
                raise ChapterError(f"{chapter}:{b.line_no}: exit status {rc}"
                                   f"{' (expected a failure)' if b.expect_fail else ''}:\n"
                                   + "\n".join(b.lines) + "\n--- output ---\n" + out)
            if b.output is not None:
                try:
                    if args.update:
                        new = updated_output(b.output.lines, out)
                        edits.append(((b.output.first_char, b.output.end_char),
                                      "".join(l + "\n" for l in new)))
                    else:
                        match_output(b.output.lines, out)
                except ChapterError as e:
                    raise ChapterError(f"{chapter}:{b.output.line_no}: {e}\n--- the commands printed ---\n{out}")
            for mk in b.markers:
                print("  " + evaluate(mk, helpers, figures_dir, args.update, edits, chapter))
                if mk.kind == "figure":
                    figures.append(mk)
        for mk in figures:  # the image after the marker must be in figures/ (committed)
            img = re.compile(r"!\[[^\]]*\]\((figures/[^)]+\.svg)\)").search(text, mk.end)
            if not img or text.count("\n", mk.end, img.start()) > 2:
                raise ChapterError(f"{chapter}:{mk.line_no}: <!--figure--> must be followed by ![...](figures/NAME.svg)")
            target = os.path.join(os.path.dirname(os.path.abspath(args.chapter)), img.group(1))
            if args.update:
                os.makedirs(figures_dir, exist_ok=True)
                shutil.copyfile(helpers.path(mk.expr), target)
            elif not os.path.exists(target):
                raise ChapterError(f"{chapter}:{mk.line_no}: {img.group(1)} is missing (run docs/tutorial/regenerate.sh)")
        if args.update and edits:
            for (start, end), new in sorted(edits, key=lambda e: e[0][0], reverse=True):
                text = text[:start] + new + text[end:]
            with open(args.chapter, "w") as f:
                f.write(text)
            print(f"updated {chapter} ({len(edits)} edits)")
    except ChapterError as e:
        print(f"FAILED {chapter}: {e}", file=sys.stderr)
        return 1
    print(f"{chapter}: {len(blocks)} command blocks, all checks passed in {time.time() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
