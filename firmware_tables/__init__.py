# This folder is the package pfcxl.firmware_tables (see pfcxl/__init__.py): one name per module.
if __name__ != "pfcxl.firmware_tables":
    raise ImportError(f"import this folder as pfcxl.firmware_tables, not {__name__}")

# whose CEDT a boot uses (boot_policy.py); here so that the CLI's parser reads it without the table code
CEDT_MODES = ("auto", "qemu", "ours")
