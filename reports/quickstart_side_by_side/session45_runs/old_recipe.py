"""The quickstart as it was in session 44 (MDLM 1,100 steps), for a timing side by side."""
import sys, time
started = time.perf_counter()
import seqdiff.quickstart as q
q.MAX_STEPS["mdlm"] = 1100
from seqdiff.cli import main
sys.exit(main(["quickstart", *sys.argv[1:]]))
