"""MkDocs hooks (mkdocs.yml `hooks:`): the files the site needs from outside docs/.

- `experiments/results/**/*.png` as `results/figures/...`, the figures the generated results
  pages show (committed once, under experiments/results/, not copied into docs/);
- `notebooks/*.ipynb` as `notebooks/...`, rendered by mkdocs-jupyter;
- `CHANGELOG.md` as `changelog.md`.
"""

from __future__ import annotations

import os

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@event_priority(100)  # before mkdocs-jupyter looks for notebooks among the files
def on_files(files: Files, config) -> Files:
    results = os.path.join(ROOT, "experiments", "results")
    for base, dirs, names in os.walk(results):
        dirs.sort()
        for name in sorted(names):
            if name.endswith(".png"):
                rel = os.path.relpath(os.path.join(base, name), results).replace(os.sep, "/")
                files.append(File.generated(config, f"results/figures/{rel}", abs_src_path=os.path.join(base, name)))
    notebooks = os.path.join(ROOT, "notebooks")
    for name in sorted(os.listdir(notebooks)):
        if name.endswith(".ipynb"):
            # a File under ROOT (not File.generated): mkdocs-jupyter rebuilds it from src_dir + src_uri
            files.append(File(f"notebooks/{name}", src_dir=ROOT, dest_dir=config["site_dir"],
                              use_directory_urls=config["use_directory_urls"]))
    files.append(File.generated(config, "changelog.md", abs_src_path=os.path.join(ROOT, "CHANGELOG.md")))
    return files
