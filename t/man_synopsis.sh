#!/bin/sh
# SPDX-License-Identifier: MIT
# man_synopsis.sh: defer_free(3)'s SYNOPSIS declares what include/cudefer.h
# declares, word for word (types, const, parameter names), and nothing else;
# each function has its page (man/NAME.3) and a word in NAME, and each page
# is a function's.  A function the header has as a macro alone
# (defer_device_stats_get) is shown with the macro's parameter names.
srcdir=${srcdir:-.}
man=$srcdir/man/defer_free.3
hdr=$srcdir/include/cudefer.h

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cudefer-synopsis.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT

# One declaration a line, blanks collapsed, none inside parentheses or
# before a comma, troff's \- as -.
normalize() {
  sed 's/\\-/-/g; s/[ 	][ 	]*/ /g; s/^ //; s/ $//; s/( /(/g; s/ )/)/g;
       s/ ,/,/g' | sort
}

# The SYNOPSIS: each .B or .BI line's quoted and bare arguments joined (the
# font alternation dropped), lines joined up to the ';'.
awk '/^\.SH SYNOPSIS/ { on = 1; next }
     on && /^\.SH / { exit }
     on && /^\.BI? / && !/#include/ {
       line = $0; sub(/^\.BI? /, "", line); out = ""
       while (length(line) > 0) {
         c = substr(line, 1, 1)
         if (c == "\"") {
           line = substr(line, 2); i = index(line, "\"")
           if (i == 0) i = length(line) + 1
           out = out substr(line, 1, i - 1); line = substr(line, i + 1)
         } else if (c == " ") {
           line = substr(line, 2)
         } else {
           match(line, /^[^ "]+/); out = out substr(line, 1, RLENGTH)
           line = substr(line, RLENGTH + 1)
         }
       }
       decl = decl " " out
       if (decl ~ /;[ ]*$/) { print decl; decl = "" }
     }' "$man" | normalize > "$tmp/man"

# The header's declarations: CUDEFER_API functions and typedefs, to the ';'.
awk '/^(CUDEFER_API|typedef)/ { on = 1; decl = "" }
     on { decl = decl " " $0; if ($0 ~ /;/) { print decl; on = 0 } }' \
  "$hdr" | sed 's/CUDEFER_API//' | normalize > "$tmp/hdr"

# The function a declaration names (a typedef's name for a typedef).
names() {
  sed -n 's/.*[ *(]\(defer_[a-z_]*\)[)]*(.*/\1/p' "$1" | sort -u
}

echo "1..5"

if [ -s "$tmp/man" ] && [ -s "$tmp/hdr" ]; then
  echo "ok 1 - SYNOPSIS and header declarations read ($(wc -l < "$tmp/man") and $(wc -l < "$tmp/hdr"))"
else
  echo "not ok 1 - SYNOPSIS and header declarations read"
fi

# 2: each SYNOPSIS line is a header declaration, or a macro of the header
# taking the same parameter names.
bad=
while IFS= read -r decl; do
  grep -qxF "$decl" "$tmp/hdr" && continue
  name=$(printf '%s\n' "$decl" | sed -n 's/.*[ *(]\(defer_[a-z_]*\)(.*/\1/p')
  params=$(printf '%s\n' "$decl" |
    sed -n 's/.*defer_[a-z_]*(\(.*\));$/\1/p' |
    tr ',' '\n' | sed 's/.*[ *]\([a-z_]*\)$/\1/' | paste -sd, -)
  macro=$(sed -n "s/^#define $name(\\([^)]*\\)).*/\\1/p" "$hdr" | tr -d ' ')
  if [ -n "$name" ] && [ -n "$macro" ] && [ "$macro" = "$params" ] &&
     ! grep -q "[ *(]$name(" "$tmp/hdr"; then
    continue
  fi
  bad="$bad
# SYNOPSIS: $decl"
done < "$tmp/man"
if [ -z "$bad" ]; then
  echo "ok 2 - each SYNOPSIS declaration is cudefer.h's"
else
  echo "not ok 2 - each SYNOPSIS declaration is cudefer.h's$bad"
fi

# 3: each header declaration is in the SYNOPSIS.
bad=$(grep -vxF -f "$tmp/man" "$tmp/hdr" | sed 's/^/# cudefer.h: /')
if [ -z "$bad" ]; then
  echo "ok 3 - each cudefer.h declaration is in the SYNOPSIS"
else
  echo "not ok 3 - each cudefer.h declaration is in the SYNOPSIS"
  printf '%s\n' "$bad"
fi

# 4: a page for each function of the SYNOPSIS, and a function for each page.
names "$tmp/man" | grep -vx defer_oom_handler > "$tmp/functions"
for f in "$srcdir"/man/*.3; do
  basename "$f" .3
done | sort > "$tmp/pages"
bad=$(comm -3 "$tmp/functions" "$tmp/pages" |
  sed 's/^\t/# a page of no function: /; t; s/^/# no page: /')
if [ -z "$bad" ]; then
  echo "ok 4 - man/NAME.3 for each function, and a function for each page"
else
  echo "not ok 4 - man/NAME.3 for each function, and a function for each page"
  printf '%s\n' "$bad"
fi

# 5: NAME lists each function.
sed -n '/^\.SH NAME/,/^\.SH /p' "$man" | grep -o 'defer_[a-z_]*' |
  sort -u > "$tmp/listed"
bad=$(comm -3 "$tmp/functions" "$tmp/listed" |
  sed 's/^\t/# in NAME, not in the SYNOPSIS: /; t; s/^/# not in NAME: /')
if [ -z "$bad" ]; then
  echo "ok 5 - NAME lists each function of the SYNOPSIS"
else
  echo "not ok 5 - NAME lists each function of the SYNOPSIS"
  printf '%s\n' "$bad"
fi
