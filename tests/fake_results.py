"""Results records as results.json holds them, made up for the tests of tables, verdicts and
plots (tests/test_experiments_report.py, _verdicts.py, _plots.py, _plots_learned.py)."""

TIMED_ALONE = {"median_load_average": 1.5, "cpus": 2, "loaded_share": 0.0, "unrecorded_share": 0.0}


def run_record(table, row, seed, test, long, *, k=None, speed=10.0, load=TIMED_ALONE):
  """One run of `table`: BLEU `test` on test and `long` on test_long, each split in two length
  buckets (2 above and below), its steps timed at `speed` under the machine load `load`."""
  return {
      "table": table,
      "row": row,
      "seed": seed,
      "k": k,
      "task": "synthetic",
      "commit": "abc1234",
      "wall_time_s": 60.0,
      "steps_per_second": speed,
      "machine_load": load,
      "num_params": 1000,
      "config": {},
      "scores": {
          "validation": {"bleu": test + 1}, "test": {"bleu": test}, "test_long": {"bleu": long}
      },
      "bleu_by_source_length": {
          "test": {"3-6": test + 2, "7-12": test - 2},
          "test_long": {"13-18": long + 1, "19-24": long - 1}
      },
  }


def few_seeds():
  """Two seeds of abs and rel_kv, one of none, rel_k, rel_v and of k = 0, 1, 2 and 4."""
  return [
      run_record("ablation", "abs", 0, 50.0, 10.0, speed=10.0),
      run_record("ablation", "abs", 1, 52.0, 12.0, speed=10.0),
      run_record("ablation", "rel_kv", 0, 60.0, 40.0, speed=9.6),
      run_record("ablation", "rel_kv", 1, 62.0, 42.0, speed=9.6),
      run_record("ablation", "none", 0, 20.0, 5.0),
      run_record("ablation", "rel_k", 0, 61.0, 41.0),
      run_record("ablation", "rel_v", 0, 30.0, 20.0),
  ] + [
      run_record("k_sweep", f"k={k}", 0, 20.0 if k == 0 else 60.0, 30.0, k=k) for k in (0, 1, 2, 4)
  ]


def length_run(row, seed, test, long, oracle, *, ratio=0.8, shorter=0.6):
  """A length-table run with the schema-5 diagnostics: test_long at `long`, `oracle` at the
  references' lengths, length ratio `ratio` on test_long (1.0 on test)."""
  run = run_record("length", row, seed, test, long)
  run["oracle_length"] = {
      "test": {"bleu": test, "bleu_by_source_length": {"3-6": test + 2, "7-12": test - 2}},
      "test_long": {
          "bleu": oracle, "bleu_by_source_length": {"13-18": oracle + 1, "19-24": oracle - 1}
      }
  }
  stats = lambda r, s: {"ratio": r, "shorter": s, "longer": 0.1, "num_sentences": 10}
  run["length_statistics"] = {
      "test": {
          "unit": "tokens",
          **stats(1.0, 0.0), "by_source_length": {"3-6": stats(1.0, 0.0), "7-12": stats(1.0, 0.0)}
      }, "test_long": {
          "unit": "tokens", **stats(ratio, shorter), "by_source_length": {
              "13-18": stats(ratio + 0.1, shorter), "19-24": stats(ratio - 0.1, shorter)
          }
      }
  }
  run["scores"]["test_long"]["bleu_by_subset"] = {  # one clause above, two below the split's
      "seen constructions": {"num_sentences": 2, "bleu": long + 30.0},
      "2 clauses": {"num_sentences": 8, "bleu": long - 5.0}
  }
  run["token_accuracy_by_position"] = {
      split: {
          "accuracy": [1.0] * 8 + [0.5] * 4 + [0.0] * 4 + [None] * 4,
          "count": [40] * 8 + [20] * 4 + [9] * 4 + [0] * 4, "eos_accuracy": 0.25,
          "accuracy_all": 0.5
      } for split in ("test", "test_long")
  }
  run["attention_profile"] = {
      split: {
          "normalized_entropy": normalized, "count_by_query": [20, 20, 5],
          "entropy_by_query": [[1.0 + shift, 2.0 + shift, 3.0], [0.5, 1.5 + shift, None]]
      } for split, normalized, shift in (("test", [0.5, 0.7], 0.0), ("test_long", [0.4, 0.6], 1.0))
  }
  return run


def length_runs():
  """Three seeds of abs, rel_kv, shape (over abs) and rel_kv_concat (over rel_kv)."""
  runs = []
  for seed in range(3):
    runs += [
        length_run("abs", seed, 96.0 + seed, 28.0 + seed, 62.0 + seed),
        length_run("rel_kv", seed, 97.0 + seed, 25.0 + 2 * seed, 25.5 + 2 * seed),
        length_run("shape", seed, 90.0 + seed, 40.0 + seed, 70.0 + seed),
        length_run("rel_kv_concat", seed, 97.0 + seed, 26.0 + 2 * seed, 60.0)
    ]
  return runs
