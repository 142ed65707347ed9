from fedface.cli import console

console()
