"""The command line: argparse over services (main), the compare command and its progress bar."""
