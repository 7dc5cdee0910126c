"""Small JSON-lines metadata files for the MetaFileDataset and RankDataset tests."""

import json


def write_jsonl(path, n, *, blank_every=0, crlf=False, trailing_newline=True):
    """Write records ``{"id": i, "file": ...}`` for ``i < n``, one per line; return ``path``.

    ``blank_every=k`` adds an empty line after every k-th record, ``crlf`` ends lines with
    CR LF, ``trailing_newline=False`` leaves the last line unterminated.
    """
    newline = "\r\n" if crlf else "\n"
    lines = []
    for i in range(n):
        lines.append(json.dumps({"id": i, "file": f"img{i:06d}.jpg"}))
        if blank_every and i % blank_every == 0:
            lines.append("")
    text = newline.join(lines) + (newline if trailing_newline else "")
    path.write_text(text, newline="")
    return path
