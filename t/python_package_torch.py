# SPDX-License-Identifier: MIT
"""t/python_package.py's cases of cudefer.torch without PyTorch or a GPU:
enable() and build() say what is missing (torch, CUDA, a C++ compiler,
ninja, CUDA headers) or that compiling failed; check_cxx_runtime refuses
a build with a C++ runtime of its own; build() passes over a compiler
whose builds carry one or whose path has a blank, compiles every unit of the package, names its
build after every file's contents and names the file a failure is in,
or the build directory it cannot write; removes the lock file a killed build
left, and waits for a build under way in another process;
enable() on a stand-in build installs once for threads that call it
together, says PyTorch's refusal, and names another failure's cause;
after PyTorch initialized CUDA it says so before any build; it leaves
CUDA uninitialized (cpp_extension's import asks NVML), so that a fork
child can use it."""
import os
import shutil
import subprocess
import sys

from python_package_fakes import fake_torch
from python_package_harness import LIB, PYTHON_DIR, py, raises, skip, tap



def tool_output_bytes(tmp, static):
    """objdump prints the file's path, bytes in no encoding in particular:
    check_cxx_runtime reads its output as the file system names it, so a
    path that is not UTF-8 under a UTF-8 locale is no error (readelf left
    out of PATH, so that objdump is the tool asked)."""
    top = os.path.join(os.fsencode(tmp), b"tools-\xe9")
    bin_dir = os.path.join(top, b"bin")
    os.makedirs(bin_dir)
    missing = [t for t in ("objdump", "nm") if not shutil.which(t)]
    if missing:
        skip("check_cxx_runtime reads objdump's output as bytes",
             "no " + ", ".join(missing))
        return
    for t in ("objdump", "nm"):
        os.symlink(os.fsencode(shutil.which(t)), os.path.join(bin_dir,
                                                             os.fsencode(t)))
    lib = os.path.join(top, b"static.so")
    shutil.copy(os.fsencode(static), lib)
    rc, out = py("import cudefer.torch as t, os; "
                 "print('WHY', t.check_cxx_runtime(os.fsdecode(%r)))" % lib,
                 env={"PYTHONUTF8": "1", "PATH": os.fsdecode(bin_dir)})
    tap(rc == 0 and "a C++ runtime of its own" in out,
        "check_cxx_runtime reads objdump's output of a path that is not "
        "UTF-8 under a UTF-8 locale", out)

def compiler_choice(tmp, headers, dynamic, static):
    """build()'s choice among $CUDEFER_CXX, $CXX, g++ and c++, with fake
    compilers whose builds are dynamic (shares PyTorch's C++ runtime) or
    static (carries its own)."""
    root = fake_torch(os.path.join(tmp, "choice"), cuda_home=headers)
    bin_dir = os.path.join(tmp, "choice-bin")
    os.makedirs(bin_dir)

    def compiler(name, build):
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\nexit 1\n")
        os.chmod(path, 0o755)
        shutil.copy(build, path + ".so")
        return path
    own = compiler("own-runtime-c++", static)
    good = compiler("g++", dynamic)
    path = {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    code = "import cudefer.torch as t; print('BUILT', t.build(verbose=True))"
    rc, out = py(code, root, dict(path, CXX=own))
    tap(rc == 0 and "BUILT %s.so" % good in out
        and "not using %s" % own in out,
        "a $CXX whose build carries its own C++ runtime is passed over for "
        "g++, and verbose says so", out)
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", [own, "a C++ runtime of its own",
                                      "set CUDEFER_CXX"], root,
                     dict(path, CUDEFER_CXX=own))
    tap(ok and good not in out,
        "$CUDEFER_CXX is the only compiler tried: its refusal is said", out)
    shutil.copy(static, good + ".so")
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", ["no C++ compiler built", own, good],
                     root, dict(path, CXX=own))
    tap(ok, "no compiler's build shares the runtime: each one said", out)

    # Compilers that are links to one wrapper (ccache's /usr/lib/ccache,
    # which runs the compiler of its own name) are as many compilers.
    wrap_dir = os.path.join(tmp, "choice-wrap")
    os.makedirs(wrap_dir)
    wrapper = os.path.join(wrap_dir, "ccache")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\nexit 1\n")
    os.chmod(wrapper, 0o755)
    for name, build in (("clang++", static), ("g++", dynamic)):
        os.symlink("ccache", os.path.join(wrap_dir, name))
        shutil.copy(build, os.path.join(wrap_dir, name + ".so"))
    rc, out = py(code, root, {"CXX": "clang++", "PATH": wrap_dir + os.pathsep
                              + os.environ.get("PATH", "")})
    tap(rc == 0 and "BUILT %s.so" % os.path.join(wrap_dir, "g++") in out,
        "compilers that are links to one wrapper (ccache) are each tried",
        out)


def concurrent_builds(tmp, headers, dynamic):
    """Two threads of one process build at once, the second starting
    while the first builds (each fake build takes 0.5 s): $CXX, which
    build() sets for cpp_extension while it builds, is as it was once both
    are done, and each gets the build."""
    root = fake_torch(os.path.join(tmp, "threads"), cuda_home=headers)
    bin_dir = os.path.join(tmp, "threads-bin")
    os.makedirs(bin_dir)
    cxx = os.path.join(bin_dir, "g++")
    with open(cxx, "w") as f:
        f.write("#!/bin/sh\nexit 1\n")
    os.chmod(cxx, 0o755)
    shutil.copy(dynamic, cxx + ".so")
    code = ("import os, threading, time\n"
            "import cudefer.torch as t\n"
            "got = []\n"
            "ts = [threading.Thread(target=lambda: got.append(t.build()))\n"
            "      for _ in range(2)]\n"
            "ts[0].start()\n"
            "time.sleep(0.2)\n"
            "ts[1].start()\n"
            "[x.join() for x in ts]\n"
            "print('GOT', len(got), 'CXX', os.environ.get('CXX'))\n")
    rc, out = py(code, root, {"CUDEFER_CXX": cxx, "CXX": "the-users-c++",
                              "FAKE_BUILD_SECONDS": "0.5"})
    tap(rc == 0 and "GOT 2 CXX the-users-c++" in out,
        "two threads building at once leave $CXX as it was", out)


# Two builds of the allocator by processes of their own: the first,
# FIRST_SECONDS long, is killed (SIGKILL) once it holds cpp_extension's
# lock file when KILL is True; the second starts then, and is given 30 s.
# Prints each one's outcome and output, and the build directory's files.
BUILD_RACE = """
import glob, os, signal, subprocess, sys, time
root = os.environ["TORCH_EXTENSIONS_DIR"]
code = "import cudefer.torch as t; print('BUILT', t.build())"
def start(seconds):
    return subprocess.Popen([sys.executable, "-c", code],
                            env=dict(os.environ, FAKE_BUILD_SECONDS=seconds),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
first = start(%(first_seconds)r)
for _ in range(400):
    if glob.glob(os.path.join(root, "*", "lock")):
        break
    time.sleep(0.05)
print("LOCKED", glob.glob(os.path.join(root, "*", "lock")))
if %(kill)r:
    first.kill()
second = start("0")
try:
    out, _ = second.communicate(timeout=30)
    print("SECOND", second.returncode, out.replace("\\n", " | "))
except subprocess.TimeoutExpired:
    second.kill()
    print("SECOND HUNG", second.communicate()[0].replace("\\n", " | "))
out, _ = first.communicate()
print("FIRST", first.returncode, out.replace("\\n", " | "))
print("LEFT", sorted(os.path.basename(f)
                     for f in glob.glob(os.path.join(root, "*", "*"))))
"""


def interrupted_build(tmp, root, env):
    """A build killed while it holds cpp_extension's lock file leaves that
    file, on which cpp_extension's next build waits for good: build()
    removes it, said, and builds; a build under way in another process
    is waited for, its lock file left alone (its removal at the end would
    fail)."""
    for kill, name in ((True, "a build killed"), (False, "a build under way")):
        extensions = os.path.join(tmp, "race-%s" % kill)
        rc, out = py(BUILD_RACE % {"first_seconds": "30" if kill else "3",
                                   "kill": kill}, root,
                     dict(env, TORCH_EXTENSIONS_DIR=extensions))
        locked = [l for l in out.splitlines() if l.startswith("LOCKED ")]
        lock = locked[0][len("LOCKED ['"):-2] if locked else "?"
        second = [l for l in out.splitlines() if l.startswith("SECOND ")]
        if kill:
            ok = (second and second[0].startswith("SECOND 0 ")
                  and "BUILT " in second[0]
                  and "cudefer.torch: removed %s, left by an interrupted "
                  "build of the allocator" % lock in second[0])
        else:
            ok = (second and second[0].startswith("SECOND 0 ")
                  and "BUILT " in second[0] and "removed" not in second[0]
                  and "FIRST 0 " in out and "waiting for another process's "
                  "build of the allocator in %s" % os.path.dirname(lock)
                  in second[0])
        tap(rc == 0 and ok and "'lock'" not in out.split("LEFT")[-1],
            "%s in another process: build() %s" % (
                name, "removes its lock file, says so, and builds" if kill
                else "waits for it, says so, and leaves its lock file alone"),
            out)


def allocator_files(tmp, headers, dynamic):
    """build() with the allocator's files: it compiles every unit the
    package has, names the build after every file's contents, says a
    missing one and names the unit that failed to compile.  Runs on a copy
    of the package (in front of python/ on the path), edited."""
    rc, out = py("import cudefer.torch as t; print('FILES', t.SOURCES, "
                 "t.HEADERS)")
    words = out.split()
    shipped = sorted(f for f in os.listdir(os.path.join(PYTHON_DIR, "cudefer"))
                     if f.endswith((".cpp", ".h")))
    listed = sorted(os.path.basename(w.strip("[]',")) for w in words[1:])
    tap(rc == 0 and listed == shipped,
        "SOURCES and HEADERS list every .cpp and .h of the package, each "
        "there", "%s\nshipped %s, listed %s" % (out, shipped, listed))

    root = fake_torch(os.path.join(tmp, "files"), cuda_home=headers)
    package = os.path.join(root, "cudefer")
    shutil.copytree(os.path.join(PYTHON_DIR, "cudefer"), package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    cxx = os.path.join(tmp, "files-bin", "g++")
    os.makedirs(os.path.dirname(cxx))
    with open(cxx, "w") as f:
        f.write("#!/bin/sh\nexit 1\n")
    os.chmod(cxx, 0o755)
    shutil.copy(dynamic, cxx + ".so")
    log = os.path.join(tmp, "files.log")
    env = {"CUDEFER_CXX": cxx, "FAKE_LOAD_LOG": log}
    code = ("import cudefer.torch as t; print('BUILT', t.build()); "
            "print('SOURCES', ' '.join(t.SOURCES + t.HEADERS))")

    def build():
        """(the build's name, its sources, all files) or None."""
        if os.path.exists(log):
            os.remove(log)
        rc, out = py(code, root, env)
        files = [l.split()[1:] for l in out.splitlines()
                 if l.startswith("SOURCES ")]
        if rc != 0 or not files or not os.path.exists(log):
            return None, out
        with open(log) as f:
            called = f.read().split()
        return (called[0], called[1:], files[0]), out
    base, out = build()
    units = [] if base is None else base[1]
    tap(base is not None and units and
        all(u.endswith(".cpp") and os.path.dirname(u) == package
            for u in units) and base[2] == units + [
                p for p in base[2] if p.endswith(".h")],
        "build() hands cpp_extension every unit, from the package", out)
    if base is None:
        return
    for path in base[2]:
        with open(path) as f:
            saved = f.read()
        with open(path, "a") as f:
            f.write("\n// edited\n")
        edited, out_edited = build()
        with open(path, "w") as f:
            f.write(saved)
        again, out_again = build()
        tap(edited is not None and edited[0] != base[0] and again == base,
            "an edit of %s is a build of its own name"
            % os.path.basename(path), out_edited + out_again)
    interrupted_build(tmp, root, env)
    header = [p for p in base[2] if p.endswith(".h")][0]
    os.rename(header, header + ".away")
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", ["cudefer.torch:", header, "is missing"],
                     root, env)
    os.rename(header + ".away", header)
    tap(ok, "a missing header is said", out)

    fail = dict(env, CUDEFER_CXX=sys.executable)
    last = units[-1]
    stem = os.path.splitext(os.path.basename(last))[0]
    # The build's directory cannot be written (cpp_extension's makedirs):
    # said as that, with what to do, not as a failed compilation.
    ok, out = raises(
        "import cudefer.torch; cudefer.torch.build()", "RuntimeError",
        ["cudefer.torch: the allocator's build cannot be written",
         "/cache/torch_extensions/x", "Permission denied",
         "TORCH_EXTENSIONS_DIR"], root,
        dict(fail, FAKE_BUILD_DIR_ERRNO="13"))
    tap(ok and "compiling" not in out,
        "an unwritable build directory is said as one, with "
        "TORCH_EXTENSIONS_DIR", out)
    # $TORCH_EXTENSIONS_DIR naming a file (cpp_extension's makedirs of
    # the build directory under it: ENOTDIR) is no failed compilation.
    ok, out = raises(
        "import cudefer.torch; cudefer.torch.build()", "RuntimeError",
        ["cudefer.torch: the allocator's build cannot be written",
         "/cache/torch_extensions/x", "Not a directory",
         "TORCH_EXTENSIONS_DIR"], root,
        dict(fail, FAKE_BUILD_DIR_ERRNO="20"))
    tap(ok and "compiling" not in out,
        "a build directory under a file is said as one, with "
        "TORCH_EXTENSIONS_DIR", out)
    # A cached build that cannot be loaded (cut short by a killed build,
    # a full disk): cpp_extension's ninja sees it up to date and loads it.
    # Said as that, with the directory to delete; no compilation failed.
    damaged = os.path.join(tmp, "damaged-bin", "g++")
    os.makedirs(os.path.dirname(damaged))
    shutil.copy(cxx, damaged)
    with open(damaged + ".so", "w") as f:
        f.write("cut short\n")
    ok, out = raises(
        "import cudefer.torch; cudefer.torch.build()", "RuntimeError",
        ["cudefer.torch: the allocator's build %s.so cannot be loaded"
         % damaged, "delete %s" % os.path.dirname(damaged)], root,
        dict(env, CUDEFER_CXX=damaged))
    tap(ok and "compiling" not in out,
        "a damaged cached build is said as one, with the directory to "
        "delete", out)
    ok, out = raises(
        "import cudefer.torch; cudefer.torch.build()", "RuntimeError",
        ["compiling %s with" % last, "build(verbose=True)"], root,
        dict(fail, FAKE_BUILD_OUTPUT="[2/4] c++ -c %s -o %s.o\nFAILED: "
             "%s.o\n%s:12:5: error: 'x' was not declared in this scope"
             % (last, stem, stem, last)))
    others = [u for u in units if u != last]
    tap(ok and not any(u in l for u in others for l in out.splitlines()
                       if l.startswith("RAISED")),
        "a failed compilation names the unit the compiler blamed, only it",
        out)
    ok, out = raises(
        "import cudefer.torch; cudefer.torch.build()", "RuntimeError",
        ["compiling %s with" % header], root,
        dict(fail, FAKE_BUILD_OUTPUT="".join(
            "FAILED: %s.o\n%s:3:1: error: expected ';'\n"
            % (os.path.splitext(os.path.basename(u))[0], header)
            for u in units)))
    tap(ok and not any(u in l for u in units for l in out.splitlines()
                       if l.startswith("RAISED")),
        "an error in the header names the header, not the units that "
        "include it", out)


# A stand-in for the compiled allocator: cudefer_torch_install counts its
# calls (cudefer_torch_recorded reads them) and returns $FAKE_INSTALL_RC,
# with $FAKE_INSTALL_MESSAGE as its reason, else PyTorch's refusal for 3.
FAKE_EXTENSION_C = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int calls;
int cudefer_torch_install(const void *fns, char *message, size_t size)
{
    const char *rc = getenv("FAKE_INSTALL_RC");
    (void)fns;
    calls++;
    usleep(50000); /* long enough for the other threads to arrive */
    const char *why = getenv("FAKE_INSTALL_MESSAGE");
    if (why != NULL)
        strncpy(message, why, size - 1);
    else if (rc != NULL && atoi(rc) == 3)
        strncpy(message, "Can't swap an already initialized allocator",
                size - 1);
    return rc != NULL ? atoi(rc) : 0;
}
unsigned long long cudefer_torch_recorded(void) { return calls; }
double cudefer_torch_bookkeeping_ns(int n) { return n; }
"""


def enable_cases(tmp, headers, cc):
    """enable() on a build that installs (a stand-in): once for threads
    that call it together, and again after PyTorch refused; a fork child
    after it can use CUDA."""
    root = fake_torch(os.path.join(tmp, "enable"), cuda_home=headers)
    cxx = os.path.join(tmp, "enable-bin", "g++")
    os.makedirs(os.path.dirname(cxx))
    with open(cxx, "w") as f:
        f.write("#!/bin/sh\nexit 1\n")
    os.chmod(cxx, 0o755)
    with open(cxx + ".c", "w") as f:
        f.write(FAKE_EXTENSION_C)
    subprocess.run([cc, "-shared", "-fPIC", "-o", cxx + ".so", cxx + ".c"],
                   check=True)
    rc, out = py("""
        import threading, cudefer.torch as t
        got = []
        threads = [threading.Thread(target=lambda: got.append(t.enable(%r)))
                   for _ in range(8)]
        [th.start() for th in threads]
        [th.join() for th in threads]
        print("ENABLED", len(got), set(got) == {t.enabled()},
              "INSTALLS", t.recorded())
        """ % LIB, root, {"CUDEFER_CXX": cxx})
    tap(rc == 0 and "ENABLED 8 True INSTALLS 1" in out,
        "enable() from 8 threads at once installs once, each gets the "
        "library", out)
    rc, out = py("""
        import cudefer.torch as t
        for _ in range(2):
            try:
                t.enable(%r)
            except RuntimeError as e:
                print("RAISED", e)
        print("ENABLED", t.enabled())
        """ % LIB, root, {"CUDEFER_CXX": cxx, "FAKE_INSTALL_RC": "3"})
    tap(rc == 0 and out.count("RAISED cudefer.torch: call enable() before "
                              "PyTorch first uses CUDA (a CUDA tensor, "
                              "torch.cuda.set_device or current_device all "
                              "do): PyTorch refused to change its allocator "
                              "(Can't swap an already initialized "
                              "allocator)") == 2
        and "ENABLED None" in out,
        "enable() refused by PyTorch says so, each time, and enables nothing",
        out)
    # After PyTorch initialized CUDA (its allocator then set up for good)
    # enable() says so before it builds anything: the build, a compilation
    # at the first use, would only end in PyTorch's refusal.
    log = os.path.join(tmp, "enable-initialized.log")
    for use in ("torch.cuda.init()", "torch.cuda.current_device()",
                "torch.cuda.set_device(0)"):
        ok, out = raises("import torch, cudefer.torch as t; %s; t.enable(%r)"
                         % (use, LIB), "RuntimeError",
                         ["cudefer.torch: call enable() before PyTorch first "
                          "uses CUDA", "torch.cuda.is_initialized()"], root,
                         {"CUDEFER_CXX": cxx, "FAKE_LOAD_LOG": log})
        tap(ok and not os.path.exists(log),
            "enable() after %s says so in one line, before any build" % use,
            out + ("built: %s\n" % log if os.path.exists(log) else ""))
        if os.path.exists(log):
            os.remove(log)
    # What PyTorch accepts is not refused: is_available() initializes
    # nothing.
    rc, out = py("""
        import torch, cudefer.torch as t
        print("AVAILABLE", torch.cuda.is_available())
        print("ENABLED", t.enable(%r) == t.enabled(), t.recorded())
        """ % LIB, root, {"CUDEFER_CXX": cxx})
    tap(rc == 0 and "AVAILABLE True" in out and "ENABLED True 1" in out,
        "enable() after torch.cuda.is_available() installs", out)

    # cpp_extension's import calls torch.cuda.is_available(), which asks
    # CUDA unless $PYTORCH_NVML_BASED_CUDA_CHECK is 1: then a fork child of
    # the process could not use CUDA.  enable() sets the variable for that
    # import alone, and leaves it as it found it (unset, or the user's).
    for preset in (None, "0"):
        rc, out = py("""
            import os
            preset = %r
            if preset is None:
                os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
            else:
                os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = preset
            import torch, cudefer.torch as t
            t.enable(%r)
            print("VARIABLE", os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"))
            pid = os.fork()
            if pid == 0:
                try:
                    torch.cuda.init()
                except RuntimeError as e:
                    print("CHILD", e, flush=True)
                    os._exit(1)
                os._exit(0)
            print("CHILD EXIT", os.WEXITSTATUS(os.waitpid(pid, 0)[1]))
            """ % (preset, LIB), root, {"CUDEFER_CXX": cxx})
        tap(rc == 0 and "CHILD EXIT 0" in out
            and "VARIABLE %s" % preset in out,
            "after enable(), a fork child can use CUDA "
            "($PYTORCH_NVML_BASED_CUDA_CHECK%s, left so)"
            % (" unset" if preset is None else "=" + preset), out)

    # Another failure of the install (5: not PyTorch's refusal to swap an
    # allocator in use) names its own cause, in one line, never the advice
    # to call enable() first, which would not help.
    ok, out = raises("import cudefer.torch as t; t.enable(%r)" % LIB,
                     "RuntimeError", ["cudefer.torch: installing the allocator "
                                      "failed: std::bad_alloc"], root,
                     {"CUDEFER_CXX": cxx, "FAKE_INSTALL_RC": "5",
                      "FAKE_INSTALL_MESSAGE": "std::bad_alloc\nmore"})
    tap(ok and "before PyTorch first uses CUDA" not in out
        and "more" not in out,
        "enable() failing for another cause names it, in one line", out)


def torch_cases(tmp):
    ok, out = raises("import cudefer.torch; cudefer.torch.enable(%r)" % LIB,
                     "ImportError", ["cudefer.torch: PyTorch is not installed"],
                     fakes=os.path.join(tmp, "none"))
    # (an empty fakes dir: real torch absent on the machine running make
    # check; where torch is installed this case says nothing useful)
    have_torch = py("import torch")[0] == 0
    if have_torch:
        skip("without torch: ImportError naming PyTorch", "torch installed")
    else:
        tap(ok, "without torch: ImportError naming PyTorch", out)

    root = fake_torch(os.path.join(tmp, "nocuda"), cuda=None)
    ok, out = raises("import cudefer.torch; cudefer.torch.enable(%r)" % LIB,
                     "RuntimeError", ["built without CUDA"], fakes=root)
    tap(ok, "a torch without CUDA is said", out)
    root = fake_torch(os.path.join(tmp, "nocxx"),
                      cxx=os.path.join(tmp, "no-such-c++"))
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", ["no C++ compiler", "no-such-c++",
                                      "set CUDEFER_CXX"], fakes=root,
                     env={"CUDEFER_CXX": os.path.join(tmp, "no-such-c++")})
    tap(ok, "no C++ compiler: said, with the name tried", out)
    noexec = os.path.join(tmp, "not-executable-c++")
    open(noexec, "w").close()
    for value, why, what in (
            (tmp, "is a directory", "a directory"),
            (noexec, "is not executable", "a file not executable"),
            ("ccache g++", "is not a command on PATH (set CUDEFER_CXX to "
             "one program, not a command line)", "a command line")):
        ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                         "RuntimeError", ["no C++ compiler: $CUDEFER_CXX=%r %s"
                                          % (value, why), "set CUDEFER_CXX"],
                         fakes=root, env={"CUDEFER_CXX": value})
        tap(ok, "$CUDEFER_CXX naming %s is said to" % what, out)
    # A compiler at a path with a blank: cpp_extension writes it unquoted
    # into build.ninja, whose shell would split it; said before any build.
    blank = os.path.join(tmp, "my tools")
    os.makedirs(blank)
    spaced = os.path.join(blank, "g++")
    os.symlink(sys.executable, spaced)
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", ["$CUDEFER_CXX=%r" % spaced,
                                      "a blank", "ninja",
                                      "a path without one"],
                     fakes=root, env={"CUDEFER_CXX": spaced})
    tap(ok and "compiling" not in out,
        "$CUDEFER_CXX at a path with a blank is said before any build", out)
    nothing = os.path.join(tmp, "empty-path")
    os.makedirs(nothing)
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", ["no C++ compiler at a path without a "
                                      "blank (%s" % spaced, "CUDEFER_CXX"],
                     fakes=root, env={"CXX": spaced, "PATH": nothing})
    tap(ok, "$CXX at a path with a blank, and no other compiler: said", out)
    # The cases below name the "compiler" (python3: found, never run).
    one = {"CUDEFER_CXX": sys.executable}
    root = fake_torch(os.path.join(tmp, "noninja"), cxx=sys.executable,
                      ninja=False)
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", ["needs ninja"], fakes=root, env=one)
    tap(ok, "no ninja: said", out)
    root = fake_torch(os.path.join(tmp, "noheaders"), cxx=sys.executable,
                      cuda_home=os.path.join(tmp, "no-cuda"))
    # pip's CUDA runtime package, where installed, has headers too.
    os.makedirs(os.path.join(root, "nvidia"))
    open(os.path.join(root, "nvidia", "__init__.py"), "w").close()
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", ["no CUDA runtime headers",
                                      "set CUDA_HOME"], fakes=root, env=one)
    tap(ok, "no CUDA headers: said", out)
    headers = os.path.join(tmp, "cuda")
    os.makedirs(os.path.join(headers, "include"))
    open(os.path.join(headers, "include", "cuda_runtime_api.h"), "w").close()
    root = fake_torch(os.path.join(tmp, "fails"), cxx=sys.executable,
                      cuda_home=headers)
    ok, out = raises("import cudefer.torch; cudefer.torch.enable(%r)" % LIB,
                     "RuntimeError", ["compiling", "torch_allocator.cpp",
                                      "boom", "build(verbose=True)"],
                     fakes=root, env=one)
    tap(ok, "a failed compilation: said, with the compiler's first line",
        out)

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx:
        src = os.path.join(tmp, "fmt.cpp")
        with open(src, "w") as f:
            f.write('#include <sstream>\n#include <string>\n'
                    'extern "C" int fmt(unsigned long n, char *o) {'
                    ' std::ostringstream s; s << n; std::string t = s.str();'
                    ' o[t.copy(o, 30)] = 0; return 1; }\n')
        dyn = os.path.join(tmp, "dynamic.so")
        subprocess.run([cxx, "-shared", "-fPIC", "-o", dyn, src], check=True)
        rc, out = py("import cudefer.torch as t; print('WHY', t.check_cxx_runtime(%r))"
                     % dyn)
        tap(rc == 0 and "WHY None" in out,
            "check_cxx_runtime takes a build that links libstdc++ dynamically",
            out)
        allocator_files(tmp, headers, dyn)
        cc = shutil.which("gcc") or shutil.which("cc")
        if cc:
            enable_cases(tmp, headers, cc)
        else:
            skip("enable() on a build that installs", "no cc")
        plain = os.path.join(tmp, "plain.so")
        with open(os.path.join(tmp, "plain.c"), "w") as f:
            f.write("int plain(int x) { return x + 1; }\n")
        subprocess.run([shutil.which("gcc") or shutil.which("cc") or cxx,
                        "-shared", "-fPIC", "-x", "c", "-o", plain,
                        os.path.join(tmp, "plain.c")], check=True)
        rc, out = py("import cudefer.torch as t; print('WHY', t.check_cxx_runtime(%r))"
                     % plain)
        tap(rc == 0 and "WHY None" in out,
            "check_cxx_runtime takes a build that needs no C++ runtime of "
            "its own (its C++ calls reach torch's)", out)
        static = os.path.join(tmp, "static.so")
        built = subprocess.run([cxx, "-shared", "-fPIC", "-static-libstdc++",
                                "-o", static, src], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
        if built.returncode != 0:
            skip("check_cxx_runtime refuses a build with its own C++ runtime",
                 "no static libstdc++")
        else:
            rc, out = py("import cudefer.torch as t; print('WHY', t.check_cxx_runtime(%r))"
                         % static)
            tap(rc == 0 and "a C++ runtime of its own" in out,
                "check_cxx_runtime refuses a build with its own C++ runtime",
                out)
            tool_output_bytes(tmp, static)
            compiler_choice(tmp, headers, dyn, static)
        concurrent_builds(tmp, headers, dyn)
    else:
        skip("check_cxx_runtime", "no C++ compiler")
