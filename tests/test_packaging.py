"""pyproject.toml: installable packages, and version ranges that admit what CI tests."""
import pathlib
import tomllib

import setuptools
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _project() -> dict:
  with open(ROOT / "pyproject.toml", "rb") as f:
    return tomllib.load(f)


def test_every_package_is_installed():
  find = _project()["tool"]["setuptools"]["packages"]["find"]
  found = set(setuptools.find_namespace_packages(str(ROOT), include=find["include"]))
  on_disk = {str(p.parent.relative_to(ROOT)).replace("/", ".")
             for p in (ROOT / "relpos").rglob("*.py")} | {"configs"}
  assert on_disk <= found


def test_requirements_pins_fall_in_the_supported_ranges():
  supported = {Requirement(text).name.lower().replace("_", "-"): Requirement(text)
               for text in _project()["project"]["dependencies"]}
  for line in (ROOT / "requirements.txt").read_text().splitlines():
    line = line.split("#")[0].strip()
    if not line or "==" not in line:
      continue
    pinned = Requirement(line)
    name = pinned.name.lower().replace("_", "-")
    if name in supported:
      version = next(iter(pinned.specifier)).version
      assert supported[name].specifier.contains(version), (name, version)
