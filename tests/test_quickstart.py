import json
import os
import re
import signal
from dataclasses import replace

import pytest

from seqdiff.checkpoint import read_checkpoint
from seqdiff.cli import main


def test_quickstart_end_to_end_and_reuse(tmp_path, capsys, monkeypatch):
    import seqdiff.quickstart as qs

    monkeypatch.setattr(qs, "NUM_T_SAMPLES", 1)  # the full test play is still scored, once
    recipe = qs.QUICKSTART  # and, to save time, one validation batch and 16 sampling steps
    monkeypatch.setattr(qs, "QUICKSTART", replace(recipe, train=replace(recipe.train, val_batches=1),
                                                  sample=replace(recipe.sample, steps=16)))
    interrupted = []

    class Projected(qs.ProjectedTime):  # timed from step 0 over 1 step, so a short run prints its projection
        def __init__(self, *a, **k):
            super().__init__(*a, **k, skip=0, probe=1)

        def on_train_batch_end(self, trainer, *rest):
            super().on_train_batch_end(trainer, *rest)
            if not interrupted and trainer.global_step == 2:  # Ctrl-C after MDLM's projection, before its end
                interrupted.append(self.method)
                os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(qs, "ProjectedTime", Projected)
    out, runs = tmp_path / "report", tmp_path / "runs"
    args = ["quickstart", "--max-steps", "3", "--out", str(out), "--run-dir", str(runs)]
    assert main(args) == 130  # one line saying where it stopped and the command that goes on
    err = capsys.readouterr().err
    assert "[quickstart] mdlm: " in err and " s a training step on this machine; about " in err
    assert f"seqdiff quickstart: stopped by SIGINT at step 2 of {runs / 'mdlm'}; checkpoint of step 2 saved" in err
    assert f"continue with: seqdiff quickstart --out {out} --run-dir {runs} --max-steps 3\n" in err
    assert "Traceback" not in err and not out.exists()
    assert main(args) == 0
    printed = capsys.readouterr()
    assert f"[quickstart] resuming the interrupted run in {runs / 'mdlm'}" in printed.out
    assert "[quickstart] ar: " in printed.err  # AR trains from its start: its projection is printed
    results = json.loads((out / "results.json").read_text())
    for method in ("mdlm", "ar"):
        r = results["models"][method]
        assert r["steps"] == 3 and r["bits_per_character"] > 0 and len(r["samples"]) == qs.QUICKSTART.sample.num_samples
        assert r["train_seconds"] > 0
    assert results["models"]["mdlm"]["bound"] and not results["models"]["ar"]["bound"]
    assert results["models"]["mdlm"]["sampler"] == "cached"
    # MDLM trained with what method.time_sampling=auto resolves to for it, and the summary says so; AR draws no noise
    assert results["models"]["mdlm"]["training_noise"] == {"time_sampling": "mask_count",
                                                           "mask_count_law": "inverse_sqrt"}
    assert results["models"]["ar"]["training_noise"] is None
    ngram = results["ngram"]  # computed by the command on the same splits, the order chosen on validation
    assert ngram["order"] in qs.NGRAM_ORDERS and ngram["valid_bits_per_character_by_order"][str(ngram["order"])] == min(
        ngram["valid_bits_per_character_by_order"].values())
    assert 1.0 < ngram["bits_per_character"] < 4.76  # below a uniform guess over 27 characters
    for r in results["models"].values():
        assert 0 <= r["known_word_share"] <= 1 and r["words_counted"] > 0
    summary = (out / "summary.md").read_text()
    assert "(model.kmer_sizes, hashed into at most 65,536 rows per size)" in summary
    assert ", the exact (erf) GELU in the MLPs (model.activation=gelu), blocks of 128" in summary
    assert "romeo_and_juliet" in summary and "| MDLM |" in summary and "| AR |" in summary
    # main(args) in this process: the time counts from its call (the process started long before)
    assert 0 <= results["seconds_before_call"] < 5 and "of wall-clock time (" in summary
    assert "nucleus sampling at top_p 0.9" in summary  # the samples' setting is stated
    assert "MDLM's training noise: method.time_sampling mask_count, mask_count_law inverse_sqrt" in summary
    # each model trained at its own learning rate, as its checkpoint's recipe and the summary say
    assert results["learning_rates"] == qs.LEARNING_RATES == {"mdlm": 4e-3, "ar": 2e-3}
    for method, lr in qs.LEARNING_RATES.items():
        assert read_checkpoint(runs / method / "checkpoints" / "last.ckpt")["hyper_parameters"]["train"]["lr"] == lr
    assert "AdamW lr 0.004 (MDLM) and 0.002 (AR) with cosine decay" in summary
    shown = results["models"]["ar"]["samples"]
    assert f"    {shown[qs.SHOWN - 1]}\n" in summary and f"    {shown[qs.SHOWN]}\n" not in summary
    assert f"| n-gram (Witten-Bell, order {ngram['order']}) | {ngram['bits_per_character']:.4f} |" in summary
    assert (out / "loss_curves.png").stat().st_size > 1000
    assert "| MDLM |" in printed.out
    # another seed (or step count) is another recipe: its runs are not the finished ones in the same folder
    assert main([*args, "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "holds a finished run of another recipe (train.seed: 0 -> 1)" in err and "--overwrite" in err
    assert json.loads((out / "results.json").read_text())["command"] == f"seqdiff quickstart --out {out} --max-steps 3"
    # a later call reuses finished runs instead of training again
    assert qs._run_state(runs / "mdlm", 3) == "done" and qs._run_state(runs / "mdlm", 4) == "partial"
    assert qs._run_state(tmp_path / "nothing", 2) == "new"


def test_sweep_candidates_are_valid_recipes_and_bad_names_are_refused(capsys):

    from experiments import quickstart_sweep as sweep

    for name, overrides in sweep.CANDIDATES.items():
        for method in ("mdlm", "ar"):
            config = sweep.candidate_config(name, sweep.method_overrides(overrides, method), method)
            assert config.method.name == method and config.train.val_every <= config.train.max_steps
    # a method.* candidate changes MDLM only; its AR run is the first identical AR recipe's (the baseline's)
    assert sweep.candidate_config("m", ["method.time_sampling=mask_count"], "mdlm").method.time_sampling == "mask_count"
    assert sweep.run_name("mask_count", sweep.CANDIDATES["mask_count"], "ar", sweep.CANDIDATES) == "baseline"
    assert sweep.run_name("mask_count", sweep.CANDIDATES["mask_count"], "mdlm", sweep.CANDIDATES) == "mask_count"
    assert sweep.run_name("lr4e-3", sweep.CANDIDATES["lr4e-3"], "ar", sweep.CANDIDATES) == "lr4e-3"
    name = "mask_count-complementary-16"
    assert sweep.run_name(name, sweep.CANDIDATES[name], "ar", sweep.CANDIDATES) == "complementary-16"
    assert sweep.candidate_config(name, sweep.CANDIDATES[name], "mdlm").method.complementary_masks
    # time conditioning is MDLM's too: AR has no noise level and refuses it
    assert sweep.method_overrides(["model.time_conditioning=true", "train.lr=1e-3"], "ar") == ["train.lr=1e-3"]
    assert sweep.candidate_config("tc", ["model.time_conditioning=true"], "mdlm").model.time_conditioning
    wide = sweep.candidate_config("w", ["model.hidden_size=192", "model.n_layers=3", "model.n_heads=3"], "ar")
    assert (wide.model.hidden_size, wide.model.n_layers) == (192, 3)  # the preset does not win over the sweep
    with pytest.raises(SystemExit):
        sweep.main(["--candidate", "nope"])
    assert "unknown" in capsys.readouterr().err


def test_the_sweep_reuses_a_finished_run_of_the_same_recipe_only(tmp_path):
    """A run root from before a recipe change (here AR's learning rate) holds runs of another recipe: the sweep
    names the difference instead of scoring the old run as the candidate's."""
    from experiments import quickstart_sweep as sweep
    from seqdiff.config import ConfigError

    tiny = ["train.max_steps=2", "data.batch_size=2", "model.kmer_sizes=[]"]
    first = sweep.run_candidate("tiny", tiny, tmp_path, methods=("ar",))["methods"]["ar"]
    assert first["steps"] == 2 and first["valid_bits_per_character"] > 0
    assert sweep.run_candidate("tiny", tiny, tmp_path, methods=("ar",))["methods"]["ar"] == first  # reused as is
    written = (tmp_path / "tiny" / "ar" / "checkpoints" / "last.ckpt").stat().st_mtime_ns
    with pytest.raises(ConfigError, match=r"tiny/ar holds a finished run of another recipe \(train.lr: 0.002 -> "
                                          r"0.0005\); remove it or pass another --run-root"):
        sweep.run_candidate("tiny", [*tiny, "train.lr=5e-4"], tmp_path, methods=("ar",))
    assert (tmp_path / "tiny" / "ar" / "checkpoints" / "last.ckpt").stat().st_mtime_ns == written
    # the sweep trains with model.preset=null: the quickstart's recipe (preset cpu-tiny, the same sizes) may reuse
    # the run, and a real change of size is still named
    from seqdiff.quickstart import finished_run_changes
    config = sweep.candidate_config("tiny", tiny, "ar")
    labelled = replace(config, model=replace(config.model, preset="cpu-tiny"))
    assert finished_run_changes(labelled, tmp_path / "tiny" / "ar") == ""
    wider = replace(labelled, model=replace(config.model, hidden_size=256))
    assert finished_run_changes(wider, tmp_path / "tiny" / "ar") == "model.hidden_size: 128 -> 256"


def test_both_projections_get_the_commands_start_and_the_setup_before_any_training(tmp_path, monkeypatch):
    """One after the other, the second run's projection counts the same setup as the first's (imports, data), not
    the first run's training, so its advice fits a fresh run; both know the command's start for its end."""
    import time

    import seqdiff.quickstart as qs

    configs = {method: qs.method_recipe(qs.QUICKSTART, method, max_steps=4) for method in qs.METHODS}
    projections = []

    def trained(config, run_dir, *callbacks):
        projections.append(callbacks[0])
        time.sleep(0.2)  # the first run's training: not setup
        return "new"

    monkeypatch.setattr(qs, "_train_or_reuse", trained)
    started = time.perf_counter() - 7.0
    qs._train_models(configs, {m: tmp_path / m for m in qs.METHODS}, tmp_path, sequential=True, started=started)
    assert [p.method for p in projections] == list(qs.METHODS)
    assert all(p.started == started for p in projections)
    assert 7.0 <= projections[0].setup == projections[1].setup < 7.2


def test_an_interrupted_run_of_another_recipe_is_refused_before_anything_trains(tmp_path, monkeypatch):
    """An interrupted AR run of the recipe before session 44 (lr 1e-3) in the run folder: one message naming the key
    and the way out, before a second process starts, not a failure inside it; a step count alone may change."""
    import seqdiff.quickstart as qs
    from seqdiff.config import ConfigError
    from seqdiff.training.run import train

    small = replace(qs.QUICKSTART, data=replace(qs.QUICKSTART.data, batch_size=2),
                    model=replace(qs.QUICKSTART.model, kmer_sizes=[]))
    configs = {method: qs.method_recipe(small, method, max_steps=4) for method in qs.METHODS}
    old = replace(configs["ar"], train=replace(configs["ar"].train, lr=1e-3, max_steps=2))
    train(old, tmp_path / "ar")
    assert qs._run_state(tmp_path / "ar", 4) == "partial"
    qs._check_resumable(replace(old, train=replace(old.train, max_steps=4)), tmp_path / "ar")  # longer: resumable
    monkeypatch.setattr(qs, "ChildRun", lambda *a, **k: pytest.fail("a second process was started"))
    monkeypatch.setattr(qs, "_train_or_reuse", lambda *a, **k: pytest.fail("a run was trained"))
    for sequential in (False, True):
        with pytest.raises(ConfigError, match=r"/ar holds an interrupted run of another recipe \(train.lr: 0.001 -> "
                                              r"0.002\); pass --overwrite to replace it or --run-dir"):
            qs._train_models(configs, {m: tmp_path / m for m in qs.METHODS}, tmp_path, sequential=sequential)


def test_projected_time_reports_the_training_left_and_the_steps_that_fit_the_budget(capsys):
    """Timed on a stand-in clock: steps skip..skip+probe give the seconds a step, the rest is arithmetic."""
    from types import SimpleNamespace

    import seqdiff.quickstart as qs

    now = [0.0]
    clock = qs.ProjectedTime("mdlm", steps_after=1100, runs=2, skip=5, probe=20, clock=lambda: now[0])
    trainer = SimpleNamespace(global_step=0, max_steps=1100)
    for step in range(1, 40):  # 0.5 s a step; nothing printed before step 25, one line after
        now[0] += 0.5
        trainer.global_step = step
        clock.on_train_batch_end(trainer, None, None, None, step - 1)
        assert (clock.message is None) == (step < 25)
    err = capsys.readouterr().err
    assert err.count("[quickstart]") == 1
    # (1100 - 25 + 1100) steps at 0.5 s: 18 minutes; scoring after training counts as SCORING_STEPS = 55 steps
    # (27.5 s), so (300 - 27.5) s / (2 models x 0.5 s) = 272 steps fit the budget
    assert "mdlm: 0.50 s a training step on this machine; about 18 min of training left for the 2 models" in err
    assert "`seqdiff quickstart --max-steps 272` would" in err
    fast = qs.ProjectedTime("ar", steps_after=0, runs=2).describe(0.1, 1000)
    assert fast.endswith("about 100 s of training left for the 2 models")  # 100 + 5.5 s within the budget
    # 10 steps of 50 s and 2,750 s of scoring: nothing fits, the advice is the least there is
    assert "`seqdiff quickstart --max-steps 1` would" in qs.ProjectedTime("ar", 0, 2).describe(50.0, 10)


def test_the_projection_counts_the_seconds_before_training_and_the_scoring_after_it(capsys):
    """With the command's start: the line says when the quickstart will end (the seconds so far, the training left,
    SCORING_STEPS steps of scoring), and the advice fits training beside the setup (imports, data) and the scoring,
    the seconds a rerun pays again; the seconds already trained are not counted against it."""
    from types import SimpleNamespace

    import seqdiff.quickstart as qs

    assert qs.SCORING_STEPS == 55
    for max_steps, end, advice in ((500, 288, None), (561, 318, 262)):
        now = [10.0]  # the command started at 0: 10 s of imports before training
        projected = qs.ProjectedTime("mdlm", steps_after=0, runs=2, clock=lambda now=now: now[0], started=0.0)
        trainer = SimpleNamespace(global_step=0, max_steps=max_steps)
        for step in range(1, 30):
            now[0] += 0.5
            trainer.global_step = step
            projected.on_train_batch_end(trainer, None, None, None, step - 1)
        # at step 25, 22.5 s after the start: (max_steps - 25) x 0.5 s of training left, then 27.5 s of scoring
        left = (max_steps - 25) * 0.5
        assert f"about {left:.0f} s of training left for the 2 models, the quickstart's end about {end} s after " \
               "its start" in projected.message
        assert end == round(22.5 + left + 27.5)
        if advice is None:
            assert "--max-steps" not in projected.message
        else:  # (300 - 10 s of setup - 27.5 s of scoring) / (2 models x 0.5 s) = 262 steps
            assert f"`seqdiff quickstart --max-steps {advice}` would" in projected.message
    assert capsys.readouterr().err.count("[quickstart]") == 2


def test_a_second_line_after_the_first_validation_when_the_projection_moved(capsys):
    """Steps of 0.5 s, one line at step 25; a validation pass (and checkpoint) of `pause` seconds at step 250. The
    steps since the line really took (226 x 0.5 + 30) / 226 = 0.633 s, 1.27x the timed ones: a second line with the
    new projection. A 1 s pause moves it by 0.9%: no second line. Steps of 0.4 s after the line: a lower one."""
    from types import SimpleNamespace

    import seqdiff.quickstart as qs

    for pause, second, later in ((30.0, True, 0.5), (1.0, False, 0.5), (0.0, True, 0.4)):
        now = [0.0]
        projected = qs.ProjectedTime("mdlm", steps_after=0, runs=2, skip=5, probe=20, clock=lambda now=now: now[0])
        trainer = SimpleNamespace(global_step=0, max_steps=1100)
        projected.on_validation_end(trainer, None)  # Lightning's sanity check, before the line: ignored
        for step in range(1, 300):
            now[0] += 0.5 if step <= 25 else later  # `later`: the steps after the line (0.4: a quieter machine)
            trainer.global_step = step
            projected.on_train_batch_end(trainer, None, None, None, step - 1)
            if step == 250:
                now[0] += pause
                projected.on_validation_end(trainer, None)
        err = capsys.readouterr().err
        assert err.count("[quickstart]") == 1 + second and projected.refined is not None
        if second and later == 0.5:
            # (1100 - 251) steps at 0.5 x 1.2655 s: 537 s, above the budget; beside 55 steps of scoring (34.8 s),
            # (300 - 34.8) / (2 x 0.633) = 209 steps fit
            assert ("[quickstart] mdlm at step 251, validation and checkpoints counted: 1.27x the timed steps; "
                    "about 537 s of training left for the 2 models") in err
            assert "`seqdiff quickstart --max-steps 209` would" in err
        elif second:  # faster after the line: the projection comes down, (1100 - 251) x 0.4 s = 340 s
            assert "at step 251, validation and checkpoints counted: 0.80x the timed steps; about 340 s" in err
            # (300 - 55 x 0.4) / (2 x 0.4) = 347.5 steps, 347 (or one fewer where the clock's float sums round 0.4 s
            # a step up by a hair)
            assert re.search(r"`seqdiff quickstart --max-steps 34[67]` would", err)


def test_side_by_side_the_projection_goes_by_the_slower_run(tmp_path, capsys):
    """Side by side, the second process writes its seconds a step (StepPace) and the projection waits for them
    (up to `wait` steps) and goes by the slower run: MDLM's steps alone under-projected where AR's were slower."""
    from types import SimpleNamespace

    import seqdiff.quickstart as qs
    from seqdiff.training.side_by_side import ChildRun, StepPace, StepTimer, pace_file

    offer = tmp_path / "ar.threads"
    child = object.__new__(ChildRun)  # only its files: no process is started
    child.offer = offer
    now = [0.0]
    theirs = StepPace(pace_file(offer), StepTimer(skip=5, probe=20, clock=lambda: now[0] * 1.2))  # 0.6 s a step
    ours = qs.ProjectedTime("mdlm", steps_after=0, runs=2, clock=lambda: now[0], side_by_side=True,
                            other=child.step_seconds, other_name="ar")
    trainer = SimpleNamespace(global_step=0, max_steps=1100)
    for step in range(1, 40):
        now[0] += 0.5
        trainer.global_step = step
        if step > 5:  # the second process started 5 steps later
            theirs.on_train_batch_end(SimpleNamespace(global_step=step - 5), None, None, None, step - 6)
        ours.on_train_batch_end(trainer, None, None, None, step - 1)
        assert (ours.message is None) == (step < 30)  # its own steps timed at 25, the other's at 30
    assert child.step_seconds() == pytest.approx(0.6)
    err = capsys.readouterr().err
    assert err.count("[quickstart]") == 1
    # (1100 - 30) steps each: MDLM's end at 535 s, AR's 107 s later alone, 1.35x faster on every thread: 614 s;
    # side by side a step of both costs 0.5 + 0.1 / 1.35 s, so the 300 s less 55 steps of scoring (27.5 s) fit
    # 474 steps
    assert ("mdlm: 0.50 s a training step on this machine, ar 0.60 s in the second process; about 10 min of "
            "training left for the 2 models (trained side by side)") in err
    assert "`seqdiff quickstart --max-steps 474` would" in err
    child.clear_offer()
    assert child.step_seconds() is None and not pace_file(offer).exists()

    # a second process that never says: after `wait` steps the projection goes by this run's own steps
    alone = qs.ProjectedTime("mdlm", steps_after=0, runs=2, clock=lambda: now[0], side_by_side=True,
                             other=child.step_seconds, other_name="ar", wait=10)
    for step in range(1, 40):
        now[0] += 0.5
        trainer.global_step = step
        alone.on_train_batch_end(trainer, None, None, None, step - 1)
        assert (alone.message is None) == (step < 35)
    assert "mdlm: 0.50 s a training step on this machine; about" in capsys.readouterr().err


def test_side_by_side_the_projection_counts_each_runs_own_steps_and_the_takeover():
    """AR trains fewer steps than MDLM (MAX_STEPS): its slower steps end first, and MDLM trains its last steps on
    every thread, TAKEOVER_SPEEDUP faster. Counted from where this run started, also when it resumed."""
    from types import SimpleNamespace

    import seqdiff.quickstart as qs

    assert qs.TAKEOVER_SPEEDUP == 1.35
    for start, other_steps, left, advice in ((0, 550, 240, False), (0, 1100, 309, True), (500, 50, 108, False)):
        now = [0.0]
        projected = qs.ProjectedTime("mdlm", steps_after=0, runs=2, clock=lambda now=now: now[0], side_by_side=True,
                                     other=lambda: 0.3, other_name="ar", other_steps=other_steps)
        trainer = SimpleNamespace(global_step=start, max_steps=1100)
        for step in range(start + 1, start + 30):
            now[0] += 0.25
            trainer.global_step = step
            projected.on_train_batch_end(trainer, None, None, None, step - 1)
        # at step start + 25: MDLM has 1075 - start steps left at 0.25 s, AR other_steps - 25 at 0.3 s. AR 550:
        # 525 x 0.3 = 157.5 s, then MDLM's (268.75 - 157.5) s alone 1.35x faster, 240 s: within the budget, where
        # AR's slower steps for all 1,100 would not fit (322.5 s; MDLM ends first: 268.75 + 53.75 / 1.35 = 309 s).
        # Resumed at step 500 with AR 50 steps from its end (the timing skips the resumed run's first steps too):
        # 25 x 0.3 + (143.75 - 7.5) / 1.35 = 108 s.
        line = f"about {left} s of training left for the 2 models (trained side by side)"
        assert line in projected.message and ("--max-steps" in projected.message) == advice, projected.message
    # the other run is done before this one starts: all of this run's steps, 1.35x faster throughout
    assert qs.ProjectedTime("mdlm", 0, 2, side_by_side=True).seconds_left(0.27, 100, 0.3, other_left=0) == (
        pytest.approx(20.0))


def test_steps_to_train_counts_what_a_run_still_needs(tmp_path):
    import seqdiff.quickstart as qs

    assert qs._steps_to_train(tmp_path / "nothing", 1100) == 1100


def test_the_summary_gives_each_models_steps_where_they_differ():
    import seqdiff.quickstart as qs

    same = {m: {"steps": 3, "tokens_seen": 12288} for m in qs.METHODS}
    assert qs._steps_sentence(same) == "3 steps (12,288 training tokens each)"
    own = {"mdlm": {"steps": 1100, "tokens_seen": 4505600}, "ar": {"steps": 550, "tokens_seen": 2252800}}
    assert qs._steps_sentence(own).startswith("1,100 steps for MDLM (4,505,600 training tokens) and 550 steps for AR "
                                              "(2,252,800 training tokens), each model's own step count")


def test_the_summary_names_mdlms_training_noise_as_resolved():
    import seqdiff.quickstart as qs

    assert qs._noise_sentence({}) == ""  # a results.json written before the field existed
    assert qs._noise_sentence({"training_noise": {"time_sampling": "antithetic", "mask_count_law": None}}) == (
        " MDLM's training noise: method.time_sampling antithetic.")
    uniform = qs._noise_sentence({"training_noise": {"time_sampling": "mask_count", "mask_count_law": "uniform"}})
    assert "mask_count_law uniform (k of a row's n characters masked, k uniform on 1..n" in uniform


def test_each_quickstart_run_is_the_recipe_with_its_method_learning_rate_and_steps_only():
    import seqdiff.quickstart as qs
    from experiments import quickstart_sweep as sweep

    assert qs.MAX_STEPS["mdlm"] == qs.QUICKSTART.train.max_steps and qs.MAX_STEPS["ar"] < qs.MAX_STEPS["mdlm"]
    for method in qs.METHODS:
        run = qs.method_recipe(qs.QUICKSTART, method)
        assert run.method.name == method and run.train.lr == qs.LEARNING_RATES[method]
        assert run.train.max_steps == qs.MAX_STEPS[method]
        assert replace(run, name=qs.QUICKSTART.name, method=replace(run.method, name="mdlm"),
                       train=replace(run.train, lr=qs.QUICKSTART.train.lr,
                                     max_steps=qs.QUICKSTART.train.max_steps)) == qs.QUICKSTART
        # --max-steps N: both models N steps, no interval longer than the run
        short = qs.method_recipe(qs.QUICKSTART, method, max_steps=3).train
        assert (short.max_steps, short.val_every, short.checkpoint_every, short.log_every, short.warmup_steps) == (
            3, 3, 3, 3, 3)
        assert sweep.candidate_config("baseline", [], method).train.max_steps == qs.MAX_STEPS[method]
        # the sweep starts each method from the quickstart's run of it; a candidate's train.lr still wins
        assert sweep.candidate_config("baseline", [], method).train.lr == qs.LEARNING_RATES[method]
        assert sweep.candidate_config("lr", ["train.lr=3e-3"], method).train.lr == 3e-3
    assert qs.QUICKSTART.train.lr == qs.LEARNING_RATES["mdlm"]  # the recipe file is MDLM's run
    # the summary's wording: both rates where they differ, one where they agree or a report predates them
    assert qs._learning_rates({"learning_rates": {"mdlm": 0.004, "ar": 0.001}}) == "lr 0.004 (MDLM) and 0.001 (AR)"
    assert qs._learning_rates({"config": {"train": {"lr": 0.002}}}) == "lr 0.002"


def test_a_run_longer_than_the_recipe_is_told_that_its_ar_memorizes_and_how_to_train_it():
    import seqdiff.quickstart as qs
    from experiments import quickstart_sweep as sweep

    assert qs.longer_run_note(qs.QUICKSTART.train.max_steps) is None
    assert qs.longer_run_note(10) is None
    note = qs.longer_run_note(qs.QUICKSTART.train.max_steps + 1)
    assert "AR memorizes" in note and f"{qs.QUICKSTART.train.max_steps:,} steps" in note
    overrides = note.split("train it with ")[1].split()  # the advice is valid overrides that do what it says
    ar = sweep.candidate_config("long_ar", overrides, "ar")
    assert ar.model.kmer_sizes == [] and ar.model.dropout == 0.1 and ar.method.name == "ar"


def test_the_summary_says_why_a_run_trained_in_float32():
    import seqdiff.quickstart as qs

    native = {"config": {"train": {"precision": "bf16-if-native"}}, "precision": "bf16-mixed"}
    assert qs._precision(native) == ("bf16 autocast (train.precision=bf16-if-native: this machine multiplies bf16 "
                                     "natively)")
    assert qs._precision({**native, "precision": "32-true"}) == (
        "float32 (train.precision=bf16-if-native: this machine does not multiply bf16 natively)")
    assert qs._precision({"config": {"train": {"precision": "32"}}, "precision": "32-true"}) == (
        "float32 (train.precision=32)")  # asked for: no reason to give


def test_ctrl_c_between_trainings_names_the_command_that_goes_on(tmp_path, capsys, monkeypatch):
    """Ctrl-C outside a training step (while evaluating or sampling) exits 130 naming the same command, which
    reuses the finished runs (a stop inside a training step prints its checkpoint as well)."""
    import seqdiff.quickstart

    def interrupted(**kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(seqdiff.quickstart, "run_quickstart", interrupted)
    out, runs = tmp_path / "report", tmp_path / "runs"
    assert main(["quickstart", "--out", str(out), "--run-dir", str(runs), "--seed", "3"]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "finished runs are kept and reused" in err
    assert f"continue with: seqdiff quickstart --out {out} --run-dir {runs} --seed 3" in err
