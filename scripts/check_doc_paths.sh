#!/usr/bin/env bash
# Lists every path and code name the docs mention that the tree no longer has:
#   - paths under src/ apps/ tests/ scripts/ cmake/ bench/ docs/ examples/ (and src-relative ones such as
#     `serve/llm_engine.h`) in README.md and docs/*.md that do not exist;
#   - backticked file names (`llm_loop.cc`, `test_trace.py`) that no tracked file has;
#   - backticked CamelCase names and Foo::Bar names that no file under src/ apps/ tests/ mentions.
# Paths with <placeholders> or globs are skipped; so are build outputs (build/...), lines that say the
# thing is **not yet** built, and sections whose heading starts "Not yet".
# Exit 1 when anything is listed. Usage: scripts/check_doc_paths.sh (reads only, builds nothing)
set -u
cd "$(dirname "$0")/.."
status=0
idents=$(mktemp)
names=$(mktemp)
trap 'rm -f "$idents" "$names"' EXIT
git ls-files | sed 's|.*/||' | sort -u >"$names"
git grep -hoE '\b[A-Za-z_][A-Za-z0-9_]*\b' -- src apps tests scripts cmake CMakeLists.txt | sort -u >"$idents"
# The text of $1 less what it says is not built yet.
built_only() { awk '/^#+ /{skip = ($0 ~ /^#+ Not yet/)} !skip' "$1" | grep -viE 'not yet'; }
for f in README.md docs/*.md; do
  while read -r p; do
    case "$p" in *'<'* | *'*'* | *'{'*) continue ;; esac
    [ -e "$p" ] || { echo "$f: no such path: $p"; status=1; }
  done < <(built_only "$f" | grep -oE '(^|[^A-Za-z0-9_./-])(src|apps|tests|scripts|cmake|bench|docs|examples)/[A-Za-z0-9_./<>*{}-]*[A-Za-z0-9_/]' |
    sed -E 's/^[^a-z]//' | sort -u)
  while read -r p; do
    [ -e "src/$p" ] || { echo "$f: no such path: src/$p (written as $p)"; status=1; }
  done < <(built_only "$f" | grep -oE '(^|[^A-Za-z0-9_/.-])(base|api|engine|kernels|net|serve|telemetry|tools)/[A-Za-z0-9_./-]*[A-Za-z0-9_]' |
    sed -E 's/^[^a-z]//' | sort -u)
  while read -r n; do
    grep -qxF "${n##*/}" "$names" || { echo "$f: no file named $n"; status=1; }
  done < <(built_only "$f" | grep -oE '`[A-Za-z0-9_./-]+\.(cc|h|cu|cuh|py|proto|sh)`' | tr -d '`' | sort -u)
  while read -r id; do
    for part in ${id//::/ }; do
      grep -qxF "$part" "$idents" || { echo "$f: no code names $id"; status=1; }
    done
  done < <(grep -oE '`[^`]+`' "$f" |
    grep -oE '\b[A-Z][a-z0-9]+[A-Z][A-Za-z0-9_]*\b|\b[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_~][A-Za-z0-9_]*' | sort -u)
done
exit $status
