"""Argument types shared by the benchmark scripts' command lines."""


def comma_list(item=str):
    """An argparse type: "a, b,,c" -> [item("a"), item("b"), item("c")]
    (blanks around entries and empty entries dropped). argparse applies it
    to string defaults too, and reports an entry `item` rejects as a usage
    error naming the flag."""
    def parse(text):
        return [item(entry.strip()) for entry in text.split(",") if entry.strip()]
    parse.__name__ = f"comma-separated {item.__name__}"
    return parse
