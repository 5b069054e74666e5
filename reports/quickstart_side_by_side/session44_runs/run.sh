#!/usr/bin/env bash
# The quickstart's recipes of session 43 (AR 1,100 steps at lr 1e-3) and 44 (AR 550 steps at 2e-3), alternated on
# one host, each timed by /usr/bin/time from the command's start; the code is this session's for both (old_recipe.py
# sets the two constants back). As run in session 44 (new1 wrote reports/quickstart, the others scratch folders,
# copied here: results.json, summary.md, wall.txt).
set -euo pipefail
out=reports/quickstart_side_by_side/session44_runs
new() { /usr/bin/time -v seqdiff quickstart --run-dir "/work/runs/$1" --out "/work/runs/$1_report"; }
old() { /usr/bin/time -v python reports/quickstart_side_by_side/session44_runs/old_recipe.py --run-dir "/work/runs/$1" --out "/work/runs/$1_report"; }
new qs44 2> "$out/new1.err"     # (this one as `seqdiff quickstart --run-dir /work/runs/qs44`, into reports/quickstart then)
old qs_old 2> "$out/old1.err"
new qs44b 2> "$out/new2.err"
old qs_old2 2> "$out/old2.err"
# later, with the final code of the session (TAKEOVER_SPEEDUP 1.35 in the projection), into reports/quickstart:
/usr/bin/time -v seqdiff quickstart --run-dir /work/runs/qs44c 2> "$out/new3.err"
