"""The one markdown table writer (genlab.core.tables): numeric columns right-aligned, the rest left, as a literal."""
from genlab.core.tables import markdown_row, markdown_table


def test_numeric_columns_are_right_aligned_and_blank_cells_do_not_count():
    table = markdown_table(["run", "steps", "loss", "MFU", "note"],
                           [["a", 100, "0.4148", "41.2%", "fast"], ["b", 2_000, "", "n/a", "1.2 ± 0.3 s"],
                            ["c", "1,024", "1.2e-05", "12.3%", "-"]])
    assert table == ("| run | steps | loss | MFU | note |\n"
                     "| --- | ---: | ---: | ---: | --- |\n"
                     "| a | 100 | 0.4148 | 41.2% | fast |\n"
                     "| b | 2000 |  | n/a | 1.2 ± 0.3 s |\n"
                     "| c | 1,024 | 1.2e-05 | 12.3% | - |")


def test_given_alignment_and_rows_printed_one_by_one():
    head = markdown_table(["op", "ms", "speed-up"], [], "lrr")
    assert head == "| op | ms | speed-up |\n| --- | ---: | ---: |"
    assert markdown_row(["gelu", "1.25", "1.10x"]) == "| gelu | 1.25 | 1.10x |"
    assert markdown_table(["a", "b"], [["1.10x", "4.56 M"]]) == "| a | b |\n| ---: | ---: |\n| 1.10x | 4.56 M |"
