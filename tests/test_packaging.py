"""pyproject.toml: installable packages, and version ranges that admit the versions CI pins."""
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
  on_disk = {
      str(p.parent.relative_to(ROOT)).replace("/", ".") for p in (ROOT / "relpos").rglob("*.py")
  } | {"configs"}
  assert on_disk <= found


def _name(requirement: Requirement) -> str:
  return requirement.name.lower().replace("_", "-")


def test_ci_pins_every_dependency_inside_its_supported_range():
  project = _project()["project"]
  supported = {
      _name(Requirement(text)): Requirement(text)
      for text in project["dependencies"] + project["optional-dependencies"]["test"]
  }
  pinned = {}
  for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines():
    line = line.split("#")[0].strip()
    if line:
      requirement = Requirement(line)
      pinned[_name(requirement)] = next(iter(requirement.specifier)).version
  assert set(supported) <= set(pinned)
  for name, requirement in supported.items():
    assert requirement.specifier.contains(pinned[name]), (name, pinned[name])
