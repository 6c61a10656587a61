"""Provision this host for pfcxl: what `make setup` runs.

Run from the repository root as ``python3 -m pfcxl.host_tools.provision``. It runs before the package
is installed, so it uses the standard library only and imports nothing from the project but
``pfcxl.cache`` (the cache layout). The steps are listed in ``steps.py``.

Modules, each with one job:
  cli         arguments, --help, --check, the per-step progress lines and timings, exit codes
  steps       the ordered list of the steps
  host        steps 1-3: bookworm-backports, host packages, the private trixie apt configuration
  guest       steps 4-6: guest userspace, guest kernel, the setup.json manifest
  python_env  step 7: the virtual environment with pfcxl installed editable
  apt         running apt (the system's and the private trixie configuration), .deb downloads
  unpack      .deb control fields, atomic dpkg -x into the cache, merged /usr
  debian      pure parsing: deb822 sources, mirror and keyring, kernel choice, versions
  runner      StepError, Step, and Setup: progress lines, the command log, running commands
  files       digests, JSON stamp files, atomic writes
"""
