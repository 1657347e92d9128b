"""The machine: its GPUs, the CUDA libraries our binaries need, LD_LIBRARY_PATH, ldd -r.

Writes into the work directory what the summary reads: nvidia_smi.txt, gpu_query.txt,
ldd_version.txt, cuda_libs.txt ("<soname> <path>" or "<soname> NOT_FOUND"),
ld_library_path.txt, compat.txt, ldd.txt and ldd_missing.txt.
"""

import glob
import os
import re
import shutil
import subprocess

# The sonames our binaries need when the bundle has no lib/cuda_sonames.txt.
DEFAULT_SONAMES = ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libnccl.so.2"]
COMPAT_NEEDED = re.compile(r"version .(GLIBCXX|CXXABI|GCC)_[0-9.]+. not found")
MISSING = re.compile(r"not found|undefined symbol")


def output(argv, env=None, timeout=60):
    """stdout and stderr of argv, or "" when it cannot run."""
    try:
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                              timeout=timeout, universal_newlines=True, errors="replace",
                              stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def gpus(run):
    """nvidia-smi's GPUs (also into nvidia_smi.txt and gpu_query.txt); their number."""
    run.log.say("nvidia-smi -L:")
    if not shutil.which("nvidia-smi"):
        run.log.echo("nvidia-smi not found")
        write(run.path("nvidia_smi.txt"), "nvidia-smi not found\n")
        write(run.path("gpu_query.txt"), "")
        return 0
    listing = output(["nvidia-smi", "-L"])
    run.log.echo(listing)
    write(run.path("nvidia_smi.txt"), listing)
    write(run.path("gpu_query.txt"), output(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]))
    return sum(1 for line in listing.splitlines() if line.startswith("GPU"))


def wheel_lib_dirs(python):
    """The lib/ folders of $PYTHON's nvidia-* wheels (site-packages nvidia/*/lib)."""
    if not shutil.which(python):
        return []
    roots = output([python, "-c", 'import nvidia; print("\\n".join(nvidia.__path__))'])
    dirs = []
    for root in roots.splitlines():
        if root.strip() and os.path.isdir(root.strip()):
            dirs += sorted(d for d in glob.glob(os.path.join(root.strip(), "*", "lib"))
                           if os.path.isdir(d))
    return dirs


def candidate_dirs(settings):
    """Folders that may hold the CUDA libraries, in the order they are tried:
    FSDP_CUDA_LIB_DIRS, then the toolkit and the wheels (wheels first under
    FSDP_PREFER_WHEEL=1), then ldconfig's cache."""
    dirs = [d for d in settings.cuda_lib_dirs.split(":") if d]
    home = settings.cuda_home
    toolkit = [f"{home}/lib64", f"{home}/targets/x86_64-linux/lib", f"{home}/lib"]
    wheel = wheel_lib_dirs(settings.python)
    dirs += wheel + toolkit if settings.prefer_wheel else toolkit + wheel
    if shutil.which("ldconfig"):
        cache = output(["ldconfig", "-p"])
        dirs += sorted({os.path.dirname(m) for m in re.findall(r" => (\S+)$", cache, re.M)})
    seen = set()
    return [d for d in dirs if not (d in seen or seen.add(d))]


def find_cuda_libraries(run):
    """Each soname's folder (cuda_libs.txt); the folders, in the order first found."""
    sonames = DEFAULT_SONAMES
    listed = os.path.join(run.bundle, "lib", "cuda_sonames.txt")
    if os.path.isfile(listed) and os.path.getsize(listed) > 0:
        with open(listed) as f:
            sonames = [line.strip() for line in f if line.strip()]
    candidates = candidate_dirs(run.settings)
    found_dirs, lines = [], []
    for so in sonames:
        where = next((d for d in candidates if os.path.exists(os.path.join(d, so))), None)
        if where:
            lines.append(f"{so} {where}/{so}")
            if where not in found_dirs:
                found_dirs.append(where)
            run.log.say(f"found {so} in {where}")
        else:
            lines.append(f"{so} NOT_FOUND")
            run.log.say(f"NOT FOUND: {so} (searched: {' '.join(candidates)})")
    write(run.path("cuda_libs.txt"), "".join(line + "\n" for line in lines))
    return found_dirs


def binaries(bundle):
    """The executables of bin/ and bin/tests/."""
    files = sorted(glob.glob(os.path.join(bundle, "bin", "*"))) + \
        sorted(glob.glob(os.path.join(bundle, "bin", "tests", "*")))
    return [f for f in files if os.path.isfile(f) and os.access(f, os.X_OK)]


def library_path(run, found_dirs):
    """LD_LIBRARY_PATH for our binaries: the bundle's lib/ (and lib/compat, only where this
    machine's libstdc++/libgcc_s are older than Debian 12's), the CUDA folders, then what
    the caller had."""
    lib = os.path.join(run.bundle, "lib")
    parts = [lib] + found_dirs
    if os.environ.get("LD_LIBRARY_PATH"):
        parts.append(os.environ["LD_LIBRARY_PATH"])
    compat = os.path.join(lib, "compat")
    bins = binaries(run.bundle)
    use_compat = False
    if os.path.isdir(compat) and bins:
        env = dict(os.environ, LD_LIBRARY_PATH=":".join(parts))
        if COMPAT_NEEDED.search(output(["ldd"] + bins, env=env)):
            parts.insert(1, compat)
            use_compat = True
            run.log.say("this machine's libstdc++/libgcc_s are older than Debian 12's: "
                        "using lib/compat")
    write(run.path("compat.txt"), "1\n" if use_compat else "0\n")
    path = ":".join(parts)
    write(run.path("ld_library_path.txt"), path + "\n")
    run.log.say(f"LD_LIBRARY_PATH={path}")
    return path


def check_symbols(run, ld_path):
    """ldd -r of every binary (ldd.txt): a library or symbol the libraries found lack goes
    into ldd_missing.txt with the binary's name."""
    env = dict(os.environ, LD_LIBRARY_PATH=ld_path)
    report, missing = [], []
    for b in binaries(run.bundle):
        name = os.path.relpath(b, run.bundle)
        out = output(["ldd", "-r", b], env=env)
        report.append(f"== ldd {name}\n{out.rstrip()}\n")
        if name == "bin/main_job":
            run.log.say(f"ldd {name}:")
            run.log.echo(out)
        lacking = [line.strip() for line in out.splitlines() if MISSING.search(line)]
        if lacking:
            missing += [f"{name}: {line}" for line in lacking]
            run.log.say(f"ldd {name}: MISSING:")
            run.log.echo("\n".join(lacking))
        else:
            run.log.say(f"ldd {name}: {out.count('=>')} libraries, none missing")
    write(run.path("ldd.txt"), "".join(report))
    write(run.path("ldd_missing.txt"), "".join(line + "\n" for line in missing))


def discover(run):
    """The environment phase: GPUs, ldd's glibc, the CUDA libraries, LD_LIBRARY_PATH and
    ldd -r. Returns (number of GPUs, LD_LIBRARY_PATH for our binaries)."""
    ngpu = gpus(run)
    run.log.say("ldd --version:")
    version = (output(["ldd", "--version"]).splitlines() or [""])[0]
    run.log.echo(version)
    write(run.path("ldd_version.txt"), version + "\n")
    ld_path = library_path(run, find_cuda_libraries(run))
    check_symbols(run, ld_path)
    return ngpu, ld_path
