"""`pfcxl bench`: the guest benchmark suite, its modelled columns, results files, reports and plots."""
