#!/usr/bin/env python3
"""Checks the figures the README states for its main example against a run of it.

The README's "Quick start" says what the first command's training reaches: a test accuracy after
the default epochs, and how long that takes on two CPU cores. This runs the example exactly as the
README's command does (defaults; a fresh checkpoint folder so nothing resumes), reads the JSON line
it prints last, and fails when the accuracy is more than 1 point from the stated one, or when the
stated time is off by more than a factor of 3 (machines differ, a loaded one takes longer).
    python3 tools/check_readme_figures.py build/examples/fashion_mnist/fashion_mnist [README.md]
"""
import json
import os
import re
import subprocess
import sys
import tempfile

STATED = re.compile(r"reaching\s+([0-9]+(?:\.[0-9]+)?)%\s+test\s+accuracy\s+in\s+about\s+([0-9]+)\s+(s|seconds|minutes)\s+of\s+training",
                    re.S)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    binary = sys.argv[1]
    readme = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")
    text = open(readme).read()
    m = STATED.search(text)
    if not m:
        print(f"check_readme_figures: {readme} states no 'reaching X% test accuracy in about N s of training'")
        return 1
    stated_acc = float(m.group(1))
    stated_s = float(m.group(2)) * (60 if m.group(3) == "minutes" else 1)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [binary, "--device", "cpu", "--resume", "0", "--checkpoint-dir", os.path.join(tmp, "ckpt"),
               "--log-dir", os.path.join(tmp, "logs")]
        print("check_readme_figures: " + " ".join(cmd), flush=True)
        run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if "Fashion-MNIST not found" in run.stdout:
        print("SKIPPED: Fashion-MNIST not found")
        return 0
    lines = [l for l in run.stdout.splitlines() if l.startswith("{")]
    if run.returncode != 0 or not lines:
        print(run.stdout[-4000:])
        print(f"check_readme_figures: the example failed (exit {run.returncode})")
        return 1
    got = json.loads(lines[-1])
    acc = 100.0 * float(got["test_accuracy"])
    secs = float(got["train_seconds"])
    print(f"check_readme_figures: README says {stated_acc:.2f}% in about {stated_s:.0f} s; "
          f"this run: {acc:.2f}% in {secs:.0f} s of training ({got.get('wall_seconds', '?')} s wall)")
    ok = True
    if abs(acc - stated_acc) > 1.0:
        print(f"check_readme_figures: the accuracy is {acc - stated_acc:+.2f} points from the README's")
        ok = False
    if not (stated_s / 3 <= secs <= stated_s * 3):
        print(f"check_readme_figures: the training took {secs / stated_s:.2f}x the README's time")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
