# SPDX-License-Identifier: MIT
"""bench/cpu_profile.py [--us N] [--top N] PROGRAM [ARGS...]: where a
program's CPU time goes, on machines without perf (the GPU machines have
none).  Builds bench/cpu_profile.c with cc into a temporary directory, runs
PROGRAM with it preloaded (a SIGPROF every N us of the process's CPU time,
250 by default; PROGRAM's stdout passes through; PROGRAM itself, not the
programs it starts: a shell script is not profiled), then prints, for the
reclaimer thread and for all other threads apart: the functions the samples
were in (self) and the functions on their stacks (inclusive, each counted
once a sample), named with nm from the process's own mappings.  Linux x86-64
only.  For questions such as where W6's launching threads spend their time."""
import bisect
import collections
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


class Symbols:
    """Names of addresses in the executable mappings of a process that has
    ended: the 'map' lines of the profile and nm of each file."""

    def __init__(self, map_lines):
        self.ranges = []  # (start, end, file offset, path)
        for line in map_lines:
            parts = line.split()
            if len(parts) < 6 or 'x' not in parts[1]:
                continue
            start, end = (int(x, 16) for x in parts[0].split('-'))
            self.ranges.append((start, end, int(parts[2], 16), parts[5]))
        self.ranges.sort()
        self.starts = [r[0] for r in self.ranges]
        self.tables = {}
        self.cache = {}

    def _table(self, path):
        if path not in self.tables:
            entries = []
            for flags in (['--defined-only'], ['-D', '--defined-only']):
                try:
                    out = subprocess.run(['nm', '-n'] + flags + [path],
                                         capture_output=True,
                                         text=True).stdout
                except OSError:
                    out = ''
                for line in out.splitlines():
                    parts = line.split()
                    if len(parts) == 3 and parts[1] in 'tTwWiI':
                        entries.append((int(parts[0], 16), parts[2]))
                if entries:
                    break
            entries.sort()
            self.tables[path] = ([a for a, _ in entries],
                                 [n for _, n in entries])
        return self.tables[path]

    def _absolute(self, path):
        """Whether path is an ELF executable not built as PIE
        (e_type ET_EXEC)."""
        try:
            with open(path, 'rb') as f:
                head = f.read(18)
        except OSError:
            return False
        return head[:4] == b'\x7fELF' and head[16:18] == b'\x02\x00'

    def name(self, addr):
        """'file:function' for an address ('file:?' where nm knows none)."""
        if addr in self.cache:
            return self.cache[addr]
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0 or addr >= self.ranges[i][1]:
            name = '?'
        else:
            start, _, offset, path = self.ranges[i]
            addrs, names = self._table(path)
            # A position-independent object's symbols are offsets in it
            # (its code's addresses equal its file offsets); an executable
            # built without PIE has absolute ones.
            rel = addr if self._absolute(path) else addr - start + offset
            j = bisect.bisect_right(addrs, rel) - 1
            name = '%s:%s' % (os.path.basename(path),
                              names[j] if j >= 0 else '?')
        self.cache[addr] = name
        return name


def build(tmp):
    lib = os.path.join(tmp, 'cpu_profile.so')
    subprocess.run(['cc', '-O2', '-shared', '-fPIC', '-o', lib,
                    os.path.join(HERE, 'cpu_profile.c')], check=True)
    return lib


def read_profile(path):
    samples, maps, header = [], [], ''
    with open(path) as f:
        for line in f:
            if line.startswith('map '):
                maps.append(line[4:])
            elif line.startswith('#'):
                header = line.strip()
            else:
                parts = line.split()
                samples.append((parts[0], [int(x, 16) for x in parts[1:]]))
    return header, samples, Symbols(maps)


def stack_of(pcs, syms):
    """The sample's functions, innermost first: the interrupted PC, then
    the return addresses past the signal frame (backtrace() starts in the
    handler)."""
    pc, frames = pcs[0], pcs[1:]
    if pc in frames:
        frames = frames[frames.index(pc) + 1:]
    # A return address points past its call: look up the byte before it.
    return [syms.name(pc)] + [syms.name(a - 1) for a in frames]


def report(header, samples, syms, top):
    print('cpu_profile:', header)
    for who, title in (('O', 'threads other than the reclaimer'),
                       ('R', 'the reclaimer')):
        stacks = [stack_of(p, syms) for w, p in samples if w == who]
        if not stacks:
            continue
        print('== %s: %d samples' % (title, len(stacks)))
        self_count = collections.Counter(s[0] for s in stacks)
        incl = collections.Counter()
        for s in stacks:
            incl.update(set(s))
        for name, c in (('self', self_count), ('inclusive', incl)):
            print('  %s:' % name)
            for k, v in c.most_common(top):
                print('    %6d %5.1f%%  %s' % (v, 100.0 * v / len(stacks), k))


def main(argv):
    us, top = 250, 30
    while argv and argv[0].startswith('--'):
        if argv[0] == '--us':
            us = int(argv[1])
        elif argv[0] == '--top':
            top = int(argv[1])
        else:
            sys.exit('cpu_profile: unknown option %s' % argv[0])
        argv = argv[2:]
    if not argv:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, 'profile.txt')
        env = dict(os.environ, LD_PRELOAD=build(tmp), CPU_PROFILE_OUT=out,
                   CPU_PROFILE_US=str(us))
        rc = subprocess.run(argv, env=env).returncode
        if not os.path.exists(out):
            sys.exit('cpu_profile: %s wrote no profile (exit status %d)' %
                     (argv[0], rc))
        report(*read_profile(out), top)
    return rc


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
