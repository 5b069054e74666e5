#!/bin/bash
# interleaved quickstart timing: old code (e5cd85b worktree) against this session's, wall clock from process start
# usage: run.sh [TAG ...] (old*: the worktree, new*: /work/main); as run: run.sh, then run.sh new3 old3
cd /work/runs/ab35
tags=("$@"); [ ${#tags[@]} -eq 0 ] && tags=(old1 new1 new2 old2)
for tag in "${tags[@]}"; do
  case $tag in old*) dir=/work/wt_old;; new*) dir=/work/main;; esac
  rm -rf /work/runs/ab35/$tag
  mkdir -p /work/runs/ab35/$tag
  ( cd $dir && /usr/bin/time -f "WALL %e" -o /work/runs/ab35/$tag/wall.txt /work/main/.ci/venv/bin/python -m seqdiff.cli quickstart \
      --out /work/runs/ab35/$tag/report --run-dir /work/runs/ab35/$tag/runs > /work/runs/ab35/$tag/stdout.txt 2> /work/runs/ab35/$tag/stderr.txt )
  echo "$tag $(date +%T) $(cat /work/runs/ab35/$tag/wall.txt)" >> /work/runs/ab35/summary.txt
done
echo done >> /work/runs/ab35/summary.txt
