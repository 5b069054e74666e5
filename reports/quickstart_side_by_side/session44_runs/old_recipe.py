"""The quickstart as it was before session 44 (AR 1,100 steps at lr 1e-3), for a timing side by side."""
import sys, time
started = time.perf_counter()
import seqdiff.quickstart as q
q.MAX_STEPS["ar"] = 1100
q.LEARNING_RATES["ar"] = 1e-3
from seqdiff.cli import main
sys.exit(main(["quickstart", *sys.argv[1:]]))
