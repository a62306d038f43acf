# SPDX-License-Identifier: MIT
"""t/python_package.py's cases of the package's library: found (by path,
$CUDEFER_LIB, pkg-config's libdir whatever its bytes and the locale's
encoding, the loader's search; where it looked when nowhere; a lib
that is no path, a directory, said), loaded once and read (stats,
device_stats of any integer device number, version; trim refused after
defer_shutdown, in words), and refused without cudefer's entry points
or without defer_version."""
import os
import shutil
import subprocess

from python_package_harness import LIB, PYTHON_DIR, py, raises, skip, tap


def pkg_config_bytes(tmp):
    """pkg-config's libdir is bytes, a path in no encoding in particular:
    found whatever the locale's encoding, as the file system names it."""
    for i, (name, libdir, env) in enumerate((
            ("UTF-8 under a locale whose encoding is not UTF-8",
             b"lib-\xc3\xa9", {"LC_ALL": "C", "PYTHONUTF8": "0"}),
            ("not UTF-8 under a UTF-8 locale", b"lib-\xe9",
             {"PYTHONUTF8": "1"}))):
        top = os.path.join(os.fsencode(tmp), b"pc-%d" % i)
        bin_dir = os.path.join(top, b"bin")
        os.makedirs(bin_dir)
        os.makedirs(os.path.join(top, libdir))
        os.symlink(os.fsencode(LIB),
                   os.path.join(top, libdir, b"libcudefer.so"))
        fake = os.path.join(bin_dir, b"pkg-config")
        with open(fake, "wb") as f:
            f.write(b"#!/bin/sh\nprintf '%s\\n' '" +
                    os.path.join(top, libdir) + b"'\n")
        os.chmod(fake, 0o755)
        path = os.fsdecode(bin_dir) + os.pathsep + os.environ.get("PATH", "")
        rc, out = py("""
            import os, cudefer
            cudefer.load()
            print("FOUND", os.path.samefile(cudefer.library(), %r))
            """ % LIB, env=dict(env, PATH=path))
        tap(rc == 0 and "FOUND True" in out,
            "pkg-config's libdir %s: the library is found there" % name, out)


def header_shapes(tmp):
    """From a source tree the field names come from cudefer.h: each name
    at its word in the struct, whatever shape later fields take (an array,
    several names in one declaration, a // comment); none past a field of
    another size, whose words cannot be told."""
    with open(os.path.join(os.path.dirname(PYTHON_DIR), "include",
                           "cudefer.h"), encoding="utf-8") as f:
        text = f.read()
    end = ("    uint64_t cache_release_failures; /* ... whose release failed: "
           "lost */\n};")
    for name, added, expected in (
            ("an array, two names in a declaration and a // comment",
             "    uint64_t latency_hist_us[4]; /* buckets */\n"
             "    // uint64_t commented_out;\n"
             "    uint64_t hits, misses;\n    uint64_t later;\n",
             ["latency_hist_us[%d]" % i for i in range(4)]
             + ["hits", "misses", "later"]),
            ("a field of another size",
             "    uint32_t flags;\n    uint32_t spare;\n"
             "    uint64_t later;\n", [])):
        top = os.path.join(tmp, "tree-%d" % len(expected))
        os.makedirs(os.path.join(top, "include"))
        shutil.copytree(os.path.join(PYTHON_DIR, "cudefer"),
                        os.path.join(top, "python", "cudefer"))
        with open(os.path.join(top, "include", "cudefer.h"), "w",
                  encoding="utf-8") as f:
            f.write(text.replace(end, end[:-2] + added + "};", 1))
        rc, out = py("""
            import cudefer
            known = list(cudefer.KNOWN_STATS_FIELDS)
            fields = cudefer.stats_fields()
            print("FIELDS", fields[:len(known)] == known, fields[len(known):])
            print("STATS", len(cudefer.stats(%r)))
            """ % LIB, fakes=os.path.join(top, "python"))
        tap(rc == 0 and "FIELDS True %r" % expected in out,
            "cudefer.h's struct with %s: each field name at its word"
            % name, out)


def library_cases(tmp):
    ok, out = raises('import cudefer; cudefer.load("/no/such/libcudefer.so")',
                     "FileNotFoundError", ["cudefer:", "lib=",
                                           "/no/such/libcudefer.so",
                                           "names no file"])
    tap(ok, "load(lib) of a missing file names it", out)
    ok, out = raises("import cudefer; cudefer.stats()", "FileNotFoundError",
                     ["$CUDEFER_LIB=/no/such.so", "names no file"],
                     env={"CUDEFER_LIB": "/no/such.so"})
    tap(ok, "a $CUDEFER_LIB naming no file is said", out)
    # A lib that is not a path (a device number given to stats() or trim())
    # is said as such, whatever fd it may name; a pathlib.Path is a path.
    for call in ("stats(1)", "trim(0)", "version(2.0)"):
        ok, out = raises("import cudefer; cudefer.%s" % call, "TypeError",
                         ["cudefer: lib=%s is not a path"
                          % call.split("(")[1].rstrip(")")])
        tap(ok and ("device_stats(" in out) == call.startswith("stats"),
            "cudefer.%s: lib is not a path, said in one line" % call, out)
    rc, out = py("""
        import pathlib, cudefer
        print("STATS", len(cudefer.stats(pathlib.Path(%r))), cudefer.library())
        """ % LIB)
    tap(rc == 0 and "STATS " in out and LIB in out,
        "a pathlib.Path is a lib", out)
    # A directory (the libdir, as for LD_LIBRARY_PATH) is said as one.
    libdir = os.path.dirname(LIB)
    ok, out = raises("import cudefer; cudefer.stats()", "FileNotFoundError",
                     ["$CUDEFER_LIB=%s is a directory" % libdir,
                      "libcudefer.so"], env={"CUDEFER_LIB": libdir})
    tap(ok, "a $CUDEFER_LIB naming a directory is said to", out)
    ok, out = raises("import cudefer; cudefer.load(%r)" % libdir,
                     "FileNotFoundError", ["lib=%r is a directory" % libdir])
    tap(ok, "a lib= naming a directory is said to", out)

    rc, out = py("""
        import cudefer
        s = cudefer.stats(%r)
        assert list(s) == cudefer.stats_fields(), list(s)
        assert all(isinstance(v, int) for v in s.values())
        print("VERSION", cudefer.version(), cudefer.library())
        """ % LIB)
    tap(rc == 0 and "VERSION " in out and LIB in out,
        "the library is loaded once and read: stats() and version()", out)
    # From the source tree the field names come from cudefer.h, a UTF-8
    # file: read as such whatever the locale's encoding (here ASCII: the C
    # locale without Python's UTF-8 mode).
    rc, out = py("""
        import cudefer
        s = cudefer.stats(%r)
        d = cudefer.device_stats(0)
        assert tuple(s) == cudefer.KNOWN_STATS_FIELDS, list(s)
        assert tuple(d) == cudefer.KNOWN_DEVICE_STATS_FIELDS, list(d)
        print("READ", len(s), len(d))
        """ % LIB, env={"LC_ALL": "C", "PYTHONUTF8": "0"})
    tap(rc == 0 and "READ " in out,
        "stats() and device_stats() read cudefer.h's field names under a "
        "locale whose encoding is not UTF-8", out)
    header_shapes(tmp)
    # cudefer.h is read once a process (the library loaded is too): a
    # later call takes the names read then, counted by the interpreter's
    # audit events of opening it.
    rc, out = py("""
        import os, sys, cudefer
        header = os.path.join(os.path.dirname(os.path.dirname(
            os.path.dirname(os.path.abspath(cudefer.__file__)))), "include",
            "cudefer.h")
        opened = []
        def hook(event, args):
            if event == "open" and isinstance(args[0], str) and \\
                    os.path.abspath(args[0]) == header:
                opened.append(event)
        sys.addaudithook(hook)
        first = list(cudefer.stats(%r))
        again = [list(cudefer.stats()) for _ in range(3)]
        fields = cudefer.stats_fields()
        fields.append("changed by the caller")
        print("OPENED", len(opened), all(a == first for a in again),
              cudefer.stats_fields() == first)
        """ % LIB)
    tap(rc == 0 and "OPENED 1 True True" in out,
        "stats() reads cudefer.h once, at its first call; stats_fields() "
        "hands out a copy", out)
    pkg_config_bytes(tmp)
    rc, out = py("""
        import cudefer
        s = cudefer.device_stats(1, %r, reset_peaks=True)
        assert list(s) == cudefer.device_stats_fields(), list(s)
        assert tuple(s) == cudefer.KNOWN_DEVICE_STATS_FIELDS, list(s)
        assert set(s.values()) == {0}, s
        print("DEVICE1", s)
        """ % LIB)
    tap(rc == 0 and "DEVICE1 " in out,
        "device_stats(): one device's counters by the header's field names "
        "(an unused device: all 0)", out)
    for bad in ("-1", "64"):
        ok, out = raises("import cudefer; cudefer.device_stats(%s, %r)"
                         % (bad, LIB), "ValueError",
                         ["cudefer: device %s: cudefer counts devices 0 .. 63"
                          % bad])
        tap(ok, "device_stats(%s) is refused in one line" % bad, out)
    for bad in ("'0'", "True", "1.0", "None"):
        ok, out = raises("import cudefer; cudefer.device_stats(%s, %r)"
                         % (bad, LIB), "ValueError",
                         ["cudefer: device %s is not a device number" % bad,
                          "0 .. 63"])
        tap(ok, "device_stats(%s) is refused in one line: not a device "
            "number" % bad, out)
    # An integer of another type (numpy's, as from an array of devices) is
    # a device number, said as one when out of range.
    name = "device_stats() takes numpy's integers"
    if py("import numpy")[0] != 0:
        skip(name, "no numpy")
    else:
        rc, out = py("""
            import cudefer, numpy
            s = cudefer.device_stats(numpy.int64(1), %r)
            print("DEVICE1", set(s.values()))
            try:
                cudefer.device_stats(numpy.int32(64))
            except ValueError as e:
                print("RAISED", e)
            """ % LIB)
        tap(rc == 0 and "DEVICE1 {0}" in out and "RAISED cudefer: device 64: "
            "cudefer counts devices 0 .. 63" in out, name, out)
    # After defer_shutdown (and in a fork child of a process that used
    # cudefer) defer_trim is refused: said as such, not as a CUDA error.
    ok, out = raises("""
        import cudefer
        cudefer.load(%r).defer_shutdown()
        print("STATS", cudefer.stats()["deferred"], cudefer.device_stats(0))
        cudefer.trim()
        """ % LIB, "RuntimeError", ["cudefer: trim() refused",
                                    "defer_shutdown", "fork child",
                                    "cudaErrorNotPermitted"])
    tap(ok and "STATS 0 " in out,
        "after defer_shutdown, stats() and device_stats() read; trim() is "
        "refused in words", out)
    # peer_access: device numbers checked before the call; a refusal or a
    # failure raised with the CUDA error's name (here: any, as the call
    # starts cudefer, which needs a device; on a GPU, peer 64 is checked).
    ok, out = raises("import cudefer; cudefer.peer_access(0, 'one')",
                     "ValueError", ["cudefer: device 'one' is not a device "
                                    "number"])
    tap(ok, "peer_access of a peer that is no device number is refused in "
        "words", out)
    rc, out = py("""
        import cudefer
        cudefer.load(%r)
        try:
            cudefer.peer_access(0, 1)
            print("GRANTED")
        except RuntimeError as e:
            print("RAISED", e)
        """ % LIB)
    tap(rc == 0 and ("GRANTED" in out or
                     "RAISED cudefer: defer_peer_access(0, 1) failed with "
                     "CUDA error " in out),
        "peer_access(0, 1) grants, or raises RuntimeError naming the call "
        "and its CUDA error", out)
    rc, out = py("""
        import cudefer
        cudefer.load(%r)
        try:
            cudefer.load("/bin/sh")
        except RuntimeError as e:
            print("RAISED", e)
        """ % LIB)
    tap("RAISED cudefer: %s is already loaded; cannot use /bin/sh too" % LIB
        in out, "a second library in the same process is refused", out)
    rc, out = py("""
        import cudefer
        cudefer.load(%r)
        print("STATS", len(cudefer.stats()), cudefer.version())
        """ % LIB, env={"CUDEFER_LIB": "/bin/sh"})
    tap(rc == 0 and "STATS " in out,
        "after load(lib), stats() and version() use that library, whatever "
        "$CUDEFER_LIB names", out)
    # Found by the dynamic loader's search (pkg-config finding nothing):
    # the same file named by its path afterwards is the same library.
    empty = os.path.join(tmp, "no-pc")
    os.makedirs(empty)
    search = {"LD_LIBRARY_PATH": os.path.dirname(LIB),
              "PKG_CONFIG_LIBDIR": empty, "PKG_CONFIG_PATH": empty}
    rc, out = py("""
        import ctypes.util, cudefer
        if ctypes.util.find_library("cudefer") is None:
            print("NO LOADER SEARCH")
        else:
            cudefer.load()
            print("FOUND", cudefer.library())
            cudefer.load(%r)
            print("SAME", cudefer.library())
        """ % LIB, env=search)
    name = ("a library the loader found is its file: load() of its path "
            "is the same library, library() a path")
    if "NO LOADER SEARCH" in out:
        skip(name, "ctypes.util.find_library does not search "
             "LD_LIBRARY_PATH here")
    else:
        found = [l.split(" ", 1)[1] for l in out.splitlines()
                 if l.startswith("FOUND ")]
        tap(rc == 0 and "SAME " in out and found and os.sep in found[0]
            and os.path.realpath(found[0]) == os.path.realpath(LIB),
            name, out)

    # Installed away from a source tree (pip install ./python), found
    # nowhere: the error lists the places searched, and no source tree's
    # src/.libs beside site-packages, which no one built.
    site = os.path.join(tmp, "site")
    shutil.copytree(os.path.join(PYTHON_DIR, "cudefer"),
                    os.path.join(site, "cudefer"))
    nowhere = {"LD_LIBRARY_PATH": "", "PKG_CONFIG_LIBDIR": empty,
               "PKG_CONFIG_PATH": empty}
    name = ("an installed package that finds no library says where it "
            "looked, no made-up source tree among them")
    rc, out = py("import ctypes.util; "
                 "print('LOADER', ctypes.util.find_library('cudefer'))",
                 env=nowhere)
    if "LOADER None" not in out:
        skip(name, "the loader's search finds a libcudefer here")
    else:
        ok, out = raises("import cudefer; cudefer.load()",
                         "FileNotFoundError",
                         ["libcudefer not found", "make install",
                          "the loader's search"], fakes=site, env=nowhere)
        tap(ok and os.path.join("src", ".libs") not in out, name, out)

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        other = os.path.join(tmp, "libother.so")
        src = os.path.join(tmp, "other.c")
        with open(src, "w") as f:
            f.write("int other(void) { return 1; }\n")
        subprocess.run([cc, "-shared", "-fPIC", "-o", other, src], check=True)
        # A library that is no cudefer at all (no defer_free) is said to
        # be none, not an older one.
        ok, out = raises("import cudefer; cudefer.load(%r)" % other,
                         "RuntimeError", ["cudefer: %s is not libcudefer" % other,
                                          "no defer_free"])
        tap(ok and "older" not in out,
            "a library without cudefer's entry points is refused: not "
            "libcudefer", out)
        # A cudefer older than the package (0.1.0's calls only) is said
        # to be one, with the calls it lacks.
        old = os.path.join(tmp, "libold.so")
        with open(src, "w") as f:
            f.write("int defer_free(void) { return 0; }\n"
                    "const char *defer_version(void) { return \"0.1.0\"; }\n"
                    "int defer_trim(void) { return 0; }\n")
        subprocess.run([cc, "-shared", "-fPIC", "-o", old, src], check=True)
        ok, out = raises("import cudefer; cudefer.load(%r)" % old,
                         "RuntimeError", ["lacks defer_pluggable_alloc_status",
                                          "older than this package"])
        tap(ok and "defer_trim" not in out.split("lacks")[-1],
            "an older libcudefer is refused, naming the calls it lacks", out)
        # A library with every call the package needs but defer_version,
        # which every libcudefer has (a stub, say), is refused at its load
        # in one line naming it, not with ctypes' AttributeError.
        partial = os.path.join(tmp, "libpartial.so")
        with open(src, "w") as f:
            f.write("".join("int %s(void) { return 0; }\n" % name for name in
                            ("defer_pluggable_alloc_status",
                             "defer_pluggable_free", "defer_record_stream",
                             "defer_trim", "defer_stats_get_sized",
                             "defer_alloc", "defer_free")))
        subprocess.run([cc, "-shared", "-fPIC", "-o", partial, src],
                       check=True)
        for call in ("load", "version", "stats"):
            ok, out = raises("import cudefer; cudefer.%s(%r)" % (call, partial),
                             "RuntimeError",
                             ["cudefer: %s is not a whole libcudefer" % partial,
                              "no defer_version"])
            tap(ok, "cudefer.%s() of a library without defer_version says so "
                "in one line" % call, out)
        # Found through $CUDEFER_LIB, a file that is no cudefer, or no
        # library at all, is said with the variable that named it.
        text = os.path.join(tmp, "notlib.so")
        with open(text, "w") as f:
            f.write("not a library\n")
        for path, kind, words, what in (
                (other, "RuntimeError", ["is not libcudefer"], "no cudefer"),
                (old, "RuntimeError", ["older than this package"],
                 "an older cudefer"),
                (text, "OSError", ["cannot load"], "no library")):
            ok, out = raises("import cudefer; cudefer.stats()", kind,
                             words + ["$CUDEFER_LIB=%s" % path],
                             env={"CUDEFER_LIB": path})
            tap(ok, "a $CUDEFER_LIB naming %s is said with the variable"
                % what, out)
    else:
        skip("a library without cudefer's entry points is refused", "no cc")
    # Blanks around $CUDEFER_LIB are ignored, as around $CUDEFER_CXX and
    # the library's own CUDEFER_* variables: a path with a stray blank was
    # said to name no file, the blank unseen.
    rc, out = py("""
        import cudefer
        print("STATS", len(cudefer.stats()), cudefer.library())
        """, env={"CUDEFER_LIB": " %s \n" % LIB})
    tap(rc == 0 and "STATS " in out and LIB in out,
        "blanks around $CUDEFER_LIB are ignored", out)
