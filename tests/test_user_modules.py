"""Tests for relpos.user_modules: --import of the user's modules and their record in a
workdir."""
import hashlib
import json
import sys

import pytest

from relpos import metrics_writer
from relpos import user_modules
from relpos import variants
from relpos import workdir_files


def test_import_modules_and_their_record_in_a_workdir(tmp_path, monkeypatch, variant_registry):  # pylint: disable=unused-argument
  monkeypatch.setattr(user_modules, "_IMPORTED", [])
  monkeypatch.delitem(sys.modules, "mine", raising=False)
  module = tmp_path / "mine.py"
  module.write_text("from relpos import variants\nLOADED = True\n\n"
                    "@variants.register('mine_variant')\n"
                    "class MineVariant(variants.Variant):\n  pass\n")
  user_modules.import_modules([str(module), "json"])
  assert sys.modules["mine"].LOADED and user_modules.imported() == [str(module), "json"]
  workdir = tmp_path / "run"
  workdir.mkdir()
  user_modules.write_imports(str(workdir))
  assert json.loads((workdir / workdir_files.IMPORTS_FILE).read_text()) == [str(module), "json"]
  # A run records only the module of its variant: an `abs` run none, a `mine_variant` run that
  # one, a run of a variant that one of them imported (registered elsewhere) all of them.
  variants.register("elsewhere")(type("Elsewhere", (variants.Variant,), {}))
  for position, recorded in (("absolute", None), ("mine_variant", [str(module)]),
                             ("elsewhere", [str(module), "json"])):
    (workdir / workdir_files.IMPORTS_FILE).unlink(missing_ok=True)
    user_modules.write_imports(str(workdir), position)
    path = workdir / workdir_files.IMPORTS_FILE
    assert (json.loads(path.read_text()) if path.exists() else None) == recorded
  user_modules.import_recorded(str(workdir))  # the same modules again: nothing changes
  assert user_modules.imported() == [str(module), "json"]
  (workdir / workdir_files.IMPORTS_FILE).write_text('{"not": "a list"}')
  with pytest.raises(ValueError, match="imports.json must hold a JSON list"):
    user_modules.import_recorded(str(workdir))
  with pytest.raises(ValueError, match=r"--import=\S*mine\.py: \S*mine\.py lies inside the "
                     r"workdir"):
    user_modules.import_modules([str(module)], refuse_under=str(tmp_path))


def test_the_code_of_a_users_variant_is_its_files_hash(tmp_path, monkeypatch, variant_registry):  # pylint: disable=unused-argument
  monkeypatch.setattr(user_modules, "_IMPORTED", [])
  module = tmp_path / "code_variant.py"
  module.write_text("from relpos import variants\n\n"
                    "@variants.register('code_variant')\n"
                    "class CodeVariant(variants.Variant):\n  pass\n")
  monkeypatch.delitem(sys.modules, "code_variant", raising=False)
  user_modules.import_modules([str(module)])
  assert user_modules.variant_code("code_variant") == {
      "file": str(module), "sha256": hashlib.sha256(module.read_bytes()).hexdigest()
  }
  module.write_text(module.read_text() + "# edited\n")  # read when asked: the file as it is now
  assert user_modules.variant_code("code_variant")["sha256"] == hashlib.sha256(
      module.read_bytes()).hexdigest()
  assert user_modules.variant_code("relative") is None


@pytest.mark.parametrize("body, words", [("sys.exit(3)", "exited with status 3"),
                                         ("sys.exit()", "exited with status 0"),
                                         ("sys.exit('no GPU here')", "exited (no GPU here)")])
def test_import_of_a_module_that_exits_is_an_error_naming_it(body, words, tmp_path, monkeypatch):
  monkeypatch.setattr(user_modules, "_IMPORTED", [])
  module = tmp_path / "leaving.py"
  module.write_text(f"import sys\n{body}\n")
  with pytest.raises(ValueError) as raised:
    user_modules.import_modules([str(module)])
  assert str(raised.value) == f"--import={module} {words} while being imported."
  assert user_modules.imported() == [] and "leaving" not in sys.modules


def test_import_of_a_missing_module_names_it(monkeypatch):
  monkeypatch.setattr(user_modules, "_IMPORTED", [])
  with pytest.raises(ValueError, match=r"^--import=no_such_module_here: no such module"):
    user_modules.import_modules(["no_such_module_here"])
  assert user_modules.imported() == []


def test_a_recorded_module_that_moved_is_taken_from_import_or_named(tmp_path, monkeypatch, caplog):
  monkeypatch.setattr(user_modules, "_IMPORTED", [])
  workdir = tmp_path / "run"
  workdir.mkdir()
  old = tmp_path / "old" / "moved_variant.py"
  (workdir / workdir_files.IMPORTS_FILE).write_text(json.dumps([str(old)]))
  imports = workdir / workdir_files.IMPORTS_FILE
  with pytest.raises(
      ValueError, match=(
          rf"^{imports}: the run's module {old} no longer exists; if it moved, pass it where it is "
          r"now, still named moved_variant\.py \(its module's name\): "
          r"--import=<its folder>/moved_variant\.py\.$")):
    user_modules.import_recorded(str(workdir))
  renamed = tmp_path / "new" / "renamed_variant.py"  # a copy under another name is not it
  renamed.parent.mkdir()
  renamed.write_text("HERE = True\n")
  user_modules.import_modules([str(renamed)])
  with pytest.raises(ValueError,
                     match=rf"no longer exists \(--import gave {renamed}\); if it moved"):
    user_modules.import_recorded(str(workdir))
  new = tmp_path / "new" / "moved_variant.py"
  new.write_text("HERE = True\n")
  user_modules.import_modules([str(new)])  # what --import does before the run's config is read
  user_modules.import_recorded(str(workdir))
  assert sys.modules["moved_variant"].HERE
  assert f"the run's module {old} no longer exists; using {new}, given with --import" in caplog.text


def test_a_variants_file_edited_since_the_last_start_is_warned_of(tmp_path, monkeypatch, caplog):
  """The checkpoints were trained by the earlier code: train.py and eval.py say so (a table
  refuses)."""
  workdir = str(tmp_path)
  metrics_writer.record_start(workdir, 0, "abc", {"file": "/x/mine.py", "sha256": "a" * 64})
  monkeypatch.setattr(user_modules, "variant_code",
                      lambda position: {"file": "/x/mine.py", "sha256": "b" * 64})
  user_modules.warn_of_edited_variant(metrics_writer.read_starts(workdir), "mine", "resuming")
  assert ("/x/mine.py was edited since this run's last start (sha256 aaaaaaaaaaaa, now "
          "bbbbbbbbbbbb): its checkpoints were trained by the earlier code of position variant "
          "'mine'; resuming.") in caplog.text
  caplog.clear()
  metrics_writer.record_start(workdir, 4, "abc", {"file": "/x/mine.py", "sha256": "b" * 64})
  user_modules.warn_of_edited_variant(metrics_writer.read_starts(workdir), "mine", "resuming")
  assert "was edited" not in caplog.text


@pytest.mark.parametrize("first_as_path", [True, False])
def test_a_file_given_as_a_path_and_as_a_module_name_is_imported_once(first_as_path, tmp_path,
                                                                      monkeypatch,
                                                                      variant_registry):  # pylint: disable=unused-argument
  """A run trained with --import=pkg/twice_variant.py records the path; evaluating it with
  --import=pkg.twice_variant (or the other way round) must not run the file a second time,
  which would register its variant again under another module name and be refused."""
  monkeypatch.setattr(user_modules, "_IMPORTED", [])
  monkeypatch.syspath_prepend(str(tmp_path))
  (tmp_path / "pkg").mkdir()
  path = tmp_path / "pkg" / "twice_variant.py"
  path.write_text("from relpos import variants\nRUNS = globals().get('RUNS', 0) + 1\n\n"
                  "@variants.register('twice_variant')\n"
                  "class TwiceVariant(variants.Variant):\n  pass\n")
  specs = [str(path), "pkg.twice_variant"]
  if not first_as_path:
    specs.reverse()
  try:
    for spec in specs:  # --import first, then the run's imports.json
      user_modules.import_modules([spec])
    assert user_modules.imported() == specs[:1]
    assert variants.get("twice_variant").__module__ in ("twice_variant", "pkg.twice_variant")
  finally:
    for name in ("twice_variant", "pkg.twice_variant", "pkg"):
      sys.modules.pop(name, None)


def test_a_module_that_fails_on_import_is_named_with_its_line(tmp_path, monkeypatch):
  monkeypatch.setattr(user_modules, "_IMPORTED", [])
  module = tmp_path / "failing_on_line_3.py"
  module.write_text("SCALE = 2\n\nRATE = SCALE / 0\n")
  with pytest.raises(ValueError) as raised:
    user_modules.import_modules([str(module)])
  assert str(raised.value) == (f"--import={module}: importing it failed at failing_on_line_3.py:3: "
                               "ZeroDivisionError: division by zero")
