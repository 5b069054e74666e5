#!/usr/bin/env bash
# The quickstart's recipes of session 44 (MDLM 1,100 steps) and 45 (MDLM 1,000 steps), alternated on one host, each
# timed by /usr/bin/time from the command's start; the code is this session's for both (old_recipe.py sets MDLM's
# step count back). As run in session 45 (each into a scratch folder, copied here: results.json, summary.md and the
# lines it printed, wall clock included).
set -euo pipefail
out=reports/quickstart_side_by_side/session45_runs
new() { /usr/bin/time -v seqdiff quickstart --run-dir "/work/runs/$1" --out "/work/runs/$1_report"; }
old() { /usr/bin/time -v python $out/old_recipe.py --run-dir "/work/runs/$1" --out "/work/runs/$1_report"; }
new qs45_new1 2> "$out/new1.err"
old qs45_old1 2> "$out/old1.err"
new qs45_new2 2> "$out/new2.err"
old qs45_old2 2> "$out/old2.err"
