"""kvembed.bundle: one directory to copy to an air-gapped host, that installs and serves offline.

``kvembed bundle ARTIFACT... --out DIR`` writes the artifacts, a wheelhouse that pip resolved for
the target (platform, Python; never this machine's site-packages), ``install.sh``, ``run.sh``, a
systemd unit, a Dockerfile, a README and ``bundle.json``. Modules, one job each: :mod:`.target`
(what the target is, in pip's and in marker terms), :mod:`.wheelhouse` (pip download and the
closure check), :mod:`.artifacts` (copy and re-hash), :mod:`.render` (the templates),
:mod:`.build` (the whole bundle, staged); the command is :mod:`kvembed.cli.bundle`.
"""
