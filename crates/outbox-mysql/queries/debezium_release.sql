DROP TRIGGER IF EXISTS `{db}`.{trigger}
