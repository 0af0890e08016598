"""Service Broker's workflows on top of the tables: ending conversations with an error (with the
application's clean-up hook) and the transmission queue that sends, resends or dead-letters."""
