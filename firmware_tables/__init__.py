# This folder is the package pfcxl.firmware_tables (see pfcxl/__init__.py): one name per module.
if __name__ != "pfcxl.firmware_tables":
    raise ImportError(f"import this folder as pfcxl.firmware_tables, not {__name__}")
