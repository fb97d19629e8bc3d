"""Reading the Markdown tables the benchmarks print."""


def table_rows(text):
    """The data rows of the first table in `text` as dicts keyed by its
    header cells."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
            for line in lines[2:]]
