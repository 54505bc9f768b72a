from cynomys.cli.main import run

run()
