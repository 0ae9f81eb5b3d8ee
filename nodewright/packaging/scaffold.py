"""`nodewright package init`: a new package that already passes its own checks.

The scaffold is a small but complete package, so an author starts from something that validates, runs
locally through every mode and builds into an image, and changes it step by step:

    config.json                 schema v1: apply, config, post-interrupt, uninstall, each with its check
    skyhook_dir/*.sh            POSIX sh steps; each writes through $NODEWRIGHT_HOST_ROOT
    root_dir/etc/<name>/        a file the agent lays over the host root (every mode but uninstall)
    Dockerfile                  the package image: busybox base, payload under /skyhook-package
    README.md                   what it does and how to test it (validate, run, build, push)

What the steps do: `apply` records the installation under `/var/lib/<name>` with the boot it ran in,
`config` installs every ConfigMap file into `/etc/<name>/conf.d/` (and removes files no longer in the
ConfigMap), `post-interrupt` records the boot it ran after, `uninstall` removes all of it. Each check
verifies exactly that, so undoing a change by hand makes it fail; the post-interrupt check reads the
node's boot id back and fails unless the node rebooted since the install (the package's interrupt is a
reboot), which `nodewright package run interrupt --interrupt reboot` simulates on a scratch root.

The image: the Dockerfile for Docker (`FROM busybox`), and, offline, `nodewright package build` onto
the busybox base layout `make images` writes (`build/images/package-base`), the route the README gives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

from nodewright.packaging import layout

INITIAL_VERSION: Final = "0.1.0"
_HOST_LINES: Final = """\
set -eu
# The node's root as this step sees it: "/" on a node (the agent chroots into the host's /), the
# directory standing for the node under `nodewright package run` and in the simulator.
HOST="${NODEWRIGHT_HOST_ROOT:-/}"; HOST="${HOST%/}"
"""
_BOOT_ID_LINES: Final = """\
# The boot the node is in: a new id after every reboot.
boot_id=unknown
if [ -r "$HOST/proc/sys/kernel/random/boot_id" ]; then
  boot_id=$(cat "$HOST/proc/sys/kernel/random/boot_id")
fi
"""

_SCRIPTS: Final = {
    "apply.sh": """\
#!/bin/sh
# apply: install @NAME@. The agent runs this once per package version and skips it after it succeeded
# (idempotence false in config.json); make it safe to run twice anyway.
@HOST@
@BOOT_ID@
mkdir -p "$HOST/var/lib/@NAME@"
# The boot it was installed in: post-interrupt-check proves the node rebooted since.
printf '%s\\n' "$boot_id" > "$HOST/var/lib/@NAME@/installed"
echo "@NAME@ installed in $HOST/var/lib/@NAME@ (boot $boot_id)"
""",
    "apply_check.sh": """\
#!/bin/sh
# apply-check: prove that apply's work is on the node; a failing check stops the rollout.
@HOST@
if [ ! -f "$HOST/var/lib/@NAME@/installed" ]; then
  echo "@NAME@ is not installed: $HOST/var/lib/@NAME@/installed is missing" >&2
  exit 1
fi
if [ ! -f "$HOST/etc/@NAME@/defaults.conf" ]; then
  echo "root_dir/ was not laid over the host: $HOST/etc/@NAME@/defaults.conf is missing" >&2
  exit 1
fi
echo "@NAME@ is installed"
""",
    "config.sh": """\
#!/bin/sh
# config: install the package's ConfigMap files ($SKYHOOK_DIR/configmaps/) into /etc/@NAME@/conf.d/.
# Runs on every ConfigMap change; files that left the ConfigMap are removed.
@HOST@
src="$SKYHOOK_DIR/configmaps"
dest="$HOST/etc/@NAME@/conf.d"
mkdir -p "$dest"
for installed in "$dest"/*; do
  [ -f "$installed" ] || continue
  name=${installed##*/}
  if [ ! -f "$src/$name" ]; then
    rm -f "$installed"
    echo "removed $name (no longer in the configMap)"
  fi
done
for given in "$src"/*; do
  [ -f "$given" ] || continue
  name=${given##*/}
  cp "$given" "$dest/.$name.tmp"
  mv -f "$dest/.$name.tmp" "$dest/$name"
  echo "configured $name"
done
""",
    "config_check.sh": """\
#!/bin/sh
# config-check: every ConfigMap file is installed unchanged, and nothing else is.
@HOST@
src="$SKYHOOK_DIR/configmaps"
dest="$HOST/etc/@NAME@/conf.d"
failed=0
for given in "$src"/*; do
  [ -f "$given" ] || continue
  name=${given##*/}
  if ! cmp -s "$given" "$dest/$name"; then
    echo "$dest/$name differs from the configMap's $name" >&2
    failed=1
  fi
done
for installed in "$dest"/*; do
  [ -f "$installed" ] || continue
  if [ ! -f "$src/${installed##*/}" ]; then
    echo "$installed is not in the configMap" >&2
    failed=1
  fi
done
exit "$failed"
""",
    "post_interrupt.sh": """\
#!/bin/sh
# post-interrupt: runs after the package's interrupt (a reboot: see README.md) finished.
@HOST@
@BOOT_ID@
mkdir -p "$HOST/var/lib/@NAME@"
printf '%s\\n' "$boot_id" > "$HOST/var/lib/@NAME@/post-interrupt"
echo "@NAME@ saw boot $boot_id"
""",
    "post_interrupt_check.sh": """\
#!/bin/sh
# post-interrupt-check: verify what only holds after the interrupt, read back from the running node.
# The package's interrupt is a reboot (README.md), so the node must be in a later boot than the one
# @NAME@ was installed in, and post-interrupt must have run after that reboot. (The drift check runs
# this too, on nodes rebooted since: any later boot passes.)
@HOST@
@BOOT_ID@
state="$HOST/var/lib/@NAME@"
installed=$(cat "$state/installed" 2>/dev/null || true)
ran_after=$(cat "$state/post-interrupt" 2>/dev/null || true)
failed=0
if [ -z "$installed" ]; then
  echo "@NAME@ is not installed: $state/installed is missing" >&2
  failed=1
elif [ "$boot_id" = "$installed" ]; then
  echo "the node has not rebooted since @NAME@ was installed (still boot $boot_id)" >&2
  failed=1
fi
if [ -z "$ran_after" ]; then
  echo "post-interrupt did not run: $state/post-interrupt is missing" >&2
  failed=1
elif [ "$ran_after" = "$installed" ]; then
  echo "post-interrupt ran in the boot @NAME@ was installed in ($installed), not after a reboot" >&2
  failed=1
fi
if [ "$failed" -eq 0 ]; then
  echo "@NAME@ was installed in boot $installed; post-interrupt ran after the reboot, in boot $ran_after"
fi
exit "$failed"
""",
    "uninstall.sh": """\
#!/bin/sh
# uninstall: remove everything the package put on the node (root_dir/ files included: the agent never
# removes them itself).
@HOST@
rm -rf "$HOST/etc/@NAME@" "$HOST/var/lib/@NAME@"
echo "@NAME@ removed"
""",
    "uninstall_check.sh": """\
#!/bin/sh
# uninstall-check: nothing of the package is left.
@HOST@
failed=0
for left in "$HOST/etc/@NAME@" "$HOST/var/lib/@NAME@"; do
  if [ -e "$left" ]; then
    echo "$left is still there" >&2
    failed=1
  fi
done
exit "$failed"
""",
}

_MODES: Final = (
    ("apply", "apply.sh"),
    ("apply-check", "apply_check.sh"),
    ("config", "config.sh"),
    ("config-check", "config_check.sh"),
    ("post-interrupt", "post_interrupt.sh"),
    ("post-interrupt-check", "post_interrupt_check.sh"),
    ("uninstall", "uninstall.sh"),
    ("uninstall-check", "uninstall_check.sh"),
)

_DOCKERFILE: Final = """\
# The @NAME@ package image. The payload goes under /skyhook-package; the package pod's init container
# runs `/bin/sh -c 'mkdir -p ... && cp -rf /skyhook-package/* ...'` in this image, so the base needs a
# shell, mkdir and cp: busybox is enough. Without Docker or a registry, `nodewright package build`
# writes the same image as an OCI layout onto the busybox base that `make images` writes in a NodeWright
# checkout (build/images/package-base): see README.md.
FROM busybox:1.36.1
COPY . /skyhook-package/
"""

_DEFAULTS: Final = """\
# Laid over the node's root by the agent (root_dir/) in every mode except uninstall.
# uninstall.sh removes it: the agent never deletes root_dir/ files itself.
"""

_README: Final = """\
# @NAME@

A NodeWright package. Describe here what it changes on a node, its ConfigMap keys and which interrupt
it needs.

What each mode does, and what its check verifies:

- `apply` (`apply.sh`): records the installation, with the boot it ran in, in
  `/var/lib/@NAME@/installed`; the check: that file and the `root_dir/` file exist.
- `config` (`config.sh`): installs every ConfigMap file into `/etc/@NAME@/conf.d/` and removes files no
  longer given; the check: each file equals the ConfigMap's, and there is no other file.
- `post-interrupt` (`post_interrupt.sh`): records the boot it ran after; the check reads the node's
  boot id back (`/proc/sys/kernel/random/boot_id`): the node has rebooted since the install, and
  post-interrupt ran after that reboot.
- `uninstall` (`uninstall.sh`): removes `/etc/@NAME@` and `/var/lib/@NAME@`; the check: both are gone.

Its interrupt is a **reboot** (the NodeWright below says so): the operator drains the node, the agent
reboots it, then post-interrupt and its check run. A package that needs no reboot drops the interrupt
and the `post-interrupt` modes; one that restarts a service instead checks what the restart changes.

`root_dir/etc/@NAME@/defaults.conf` is laid over the node's root by the agent.

Steps write through `$NODEWRIGHT_HOST_ROOT` (`"$HOST/etc/..."`): it is `/` on a node, where the agent
chroots into the host's root, and the scratch directory standing for the node in a local run.

## Try it without a cluster

```bash
nodewright package validate .
root=$(mktemp -d)
nodewright package run apply . --root "$root"
nodewright package run apply-check . --root "$root"
echo 'level=3' > /tmp/example.conf
nodewright package run config . --root "$root" --config example.conf=/tmp/example.conf
nodewright package run config-check . --root "$root" --config example.conf=/tmp/example.conf
nodewright package run post-interrupt-check . --root "$root"   # fails: the node has not rebooted
nodewright package run interrupt . --root "$root" --interrupt reboot   # the root boots, as a node would
nodewright package run post-interrupt . --root "$root"
nodewright package run post-interrupt-check . --root "$root"
nodewright package run uninstall . --root "$root"
nodewright package run uninstall-check . --root "$root"
find "$root" -type f        # what the package wrote, the agent's flags, history and logs
```

Each run copies the package to `$root/var/lib/skyhook/local/@NAME@-<version>-local-1/` as a package pod
would, and the agent runs without chroot. The interrupt run records the agent's `reboot` instead of
running it, then boots the root as the simulator boots its nodes: a new boot id, `/proc/sys` reloaded
from the sysctl files, `/proc/cmdline` rebuilt from GRUB's defaults. Undo a change by hand (e.g.
`rm $root/var/lib/@NAME@/installed`) and the check fails.

## Build the image

Offline, with no Docker and no registry: in a NodeWright checkout, `make images` (or `python
hack/images/build.py --only package-base`) writes a busybox base, `build/images/package-base`; the
package image is that base plus the payload under `/skyhook-package`, as an OCI image layout:

```bash
mkdir -p /tmp/images
nodewright package build . --base <checkout>/build/images/package-base -o /tmp/images/@NAME@
```

Run it on the simulator's nodes (`--image-dir /tmp/images`, then a NodeWright with the image
`registry.example.com/packages/@NAME@`: docs/packages.md, "Trying a package on the simulated fleet"),
push it to the simulator's real nodes (`nodewright sim push /tmp/images/@NAME@
registry.example.com/packages/@NAME@:@VERSION@`), or to a registry:

```bash
skopeo copy oci:/tmp/images/@NAME@:@VERSION@ docker://registry.example.com/packages/@NAME@:@VERSION@
docker build -t registry.example.com/packages/@NAME@:@VERSION@ .      # or with Docker, from the Dockerfile
```

## Use it

```yaml
apiVersion: nodewright.io/v1alpha1
kind: NodeWright
metadata:
  name: @NAME@
spec:
  nodeSelectors:
    matchLabels:
      node-role.kubernetes.io/gpu: ""
  packages:
    @NAME@:
      version: @VERSION@
      image: registry.example.com/packages/@NAME@
      interrupt:
        type: reboot
      configMap:
        example.conf: |
          level=3
```
"""


class ScaffoldError(Exception):
    """The package cannot be created (bad name, target directory in use)."""


def step(name: str, path: str) -> dict[str, object]:
    return {
        "name": name,
        "path": path,
        "arguments": [],
        "returncodes": [0],
        "on_host": True,
        "idempotence": False,
        "upgrade_step": False,
        "env": {},
    }


def config_json(name: str, version: str = INITIAL_VERSION) -> str:
    modes = {mode: [step(path.removesuffix(".sh"), path)] for mode, path in _MODES}
    body = {
        "schema_version": "v1",
        "package_name": name,
        "package_version": version,
        "expected_config_files": [],
        "modes": modes,
    }
    return json.dumps(body, indent=2) + "\n"


def _fill(template: str, name: str) -> str:
    return (
        template.replace("@HOST@\n", _HOST_LINES)
        .replace("@BOOT_ID@\n", _BOOT_ID_LINES)
        .replace("@NAME@", name)
        .replace("@VERSION@", INITIAL_VERSION)
    )


def files(name: str) -> dict[str, tuple[str, int]]:
    """Relative path -> (content, mode) of the scaffold for package `name`."""
    out: dict[str, tuple[str, int]] = {layout.CONFIG_FILE: (config_json(name), 0o644)}
    for script, template in _SCRIPTS.items():
        out[f"{layout.STEP_DIR}/{script}"] = (_fill(template, name), 0o755)
    out[f"{layout.ROOT_OVERLAY_DIR}/etc/{name}/defaults.conf"] = (_DEFAULTS, 0o644)
    out[layout.DOCKERFILE] = (_fill(_DOCKERFILE, name), 0o644)
    out[layout.README] = (_fill(_README, name), 0o644)
    return out


def create(name: str, target: Path) -> list[Path]:
    """Write the scaffold of package `name` into `target` (new or empty); returns the files written."""
    if not layout.PACKAGE_NAME.match(name):
        raise ScaffoldError(
            f"package name {name!r} must be lowercase letters, digits and '-', start and end with a letter, "
            f"2 to 43 characters ({layout.PACKAGE_NAME.pattern}): it is the package's key in a NodeWright"
        )
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ScaffoldError(f"{target} already exists and is not an empty directory; choose another --dir")
    written: list[Path] = []
    for relative, (content, mode) in files(name).items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        path.chmod(mode)
        written.append(path)
    return written
