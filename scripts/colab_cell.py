# Only where specnb is not installed (Colab, also after a runtime restart): find the project (SPECNB_REPO,
# /content, Drive) or clone SPECNB_REPO (a git URL), install its runtime (Colab's torch kept). docs/colab.md
import importlib.util, os, subprocess, sys
spec = importlib.util.find_spec("specnb")  # origin None: only a folder named specnb (Colab's clone in /content), not the package
if spec is None or spec.origin is None:
    home = os.environ.get("SPECNB_HOME", "/content/specnb")
    root = next((p for p in (os.environ.get("SPECNB_REPO", ""), "..", home, "/content/specnb", "/content/drive/MyDrive/specnb")
                 if os.path.isfile(os.path.join(p, "specnb", "__init__.py"))), home)
    if not os.path.isfile(os.path.join(root, "specnb", "__init__.py")):  # not found anywhere: clone it from SPECNB_REPO (a git URL)
        if not os.environ.get("SPECNB_REPO"):
            raise RuntimeError("specnb not found: set SPECNB_REPO to its git URL or folder (docs/colab.md)")
        subprocess.run(["git", "clone", "-q", "--depth", "1", os.environ["SPECNB_REPO"], root], check=True)
    subprocess.run([sys.executable, os.path.join(root, "scripts", "install_runtime.py")], check=True)  # Colab's torch kept
    sys.path.insert(0, os.path.abspath(root))
