# SPDX-License-Identifier: MIT
"""What t/python_package.py's cases are run with: LIB, the library under
test (the first argument, else src/.libs/libcudefer.so of the current
directory); tap() and skip(), which number the TAP lines in results, the
one list of outcomes main() counts for the plan; py(), a fresh
interpreter with python/ on its path; raises(), whether code raises one
kind of error in one line naming given words."""
import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(os.path.dirname(HERE), "python")
LIB = os.path.abspath(sys.argv[1] if len(sys.argv) > 1
                      else os.path.join("src", ".libs", "libcudefer.so"))

results = []


def tap(ok, name, detail=""):
    results.append(ok)
    print("%s %d - %s" % ("ok" if ok else "not ok", len(results), name))
    if detail and not ok:
        for line in detail.splitlines()[-15:]:
            print("# " + line)


def skip(name, why):
    results.append(True)
    print("ok %d - %s # SKIP %s" % (len(results), name, why))


def py(code, fakes=None, env=None):
    """Run code in a fresh interpreter with python/ (and fakes, a dir of
    fake packages, before it) on its path; return (exit status, output)."""
    full = dict(os.environ)
    for k in ("CUDEFER_LIB", "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM",
              "TORCH_EXTENSIONS_DIR"):
        full.pop(k, None)
    full["PYTHONPATH"] = os.pathsep.join(([fakes] if fakes else []) +
                                         [PYTHON_DIR])
    full["PYTHONDONTWRITEBYTECODE"] = "1"
    full.update(env or {})
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=full, timeout=120)
    return run.returncode, run.stdout


def raises(code, kind, words, fakes=None, env=None):
    """Whether code raises kind with every one of words in its message, on
    one line."""
    rc, out = py("""
        try:
%s
        except %s as e:
            text = str(e)
            print("RAISED", text.replace("\\n", " | "))
            assert "\\n" not in text, "more than one line"
        else:
            print("NOT RAISED")
        """ % (textwrap.indent(textwrap.dedent(code), " " * 12), kind),
        fakes, env)
    raised = [l for l in out.splitlines() if l.startswith("RAISED ")]
    ok = rc == 0 and raised and all(w in raised[0] for w in words)
    return ok, out
