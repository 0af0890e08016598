"""What an operator reads: the operations' results as text and tables, for the command line and
Dagster's logs. The operations return data; nothing here reads or writes the lake."""
