"""Package authoring: scaffold, validate, run locally and build NodeWright package images.

A NodeWright package is a directory that becomes a container image: `config.json` (schema v1) and the
step scripts in `skyhook_dir/`, optionally `root_dir/` (files laid over the host root), all under
`/skyhook-package` in the image. On a node, the package pod's first init container copies that payload
to a per-generation directory on the host, and our agent (`nodewright.agent`) runs one mode of it.

This package is what `nodewright package init|validate|run|build` does, kept out of the CLI module so
that each part is a small function with its own tests:

- `layout`: the image contract (payload directory, which files make the payload, package names) and the
  operator's naming of copy directories, state and log directories;
- `scaffold`: a new package that passes its own checks;
- `validate`: everything the agent would refuse, plus what breaks in a package pod, all reported at once;
- `localrun`: one agent mode against a directory standing for a node's root, staged as a package pod does;
- `oci`: the package image as an OCI image layout, reproducibly, with the standard library only.

Nothing here talks to a cluster or imports the operator's client stack (import-linter keeps it so), so
`nodewright package` starts fast and works without Kubernetes.
"""
