set pagination off
set confirm off
break before_reset
run
rwatch stats_devices[0].bytes
continue
delete
set var grown_inside = 1
call grow_block()
continue
quit
